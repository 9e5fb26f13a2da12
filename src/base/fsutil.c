/* File-system helpers. See include/kiln/fsutil.h for the atomic write protocol. */
#define _GNU_SOURCE /* nftw, fallocate */
#include "kiln/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

/* ---- reading ---- */

kiln_error *kiln_read_file(const char *path, char **data, size_t *len) {
    *data = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kiln_errorf(errno == ENOENT ? KILN_ENOTFOUND : KILN_EIO, "%s: cannot open: %s", path, strerror(errno));
    /* The size from fstat is only a first guess: read until EOF so that files
     * that change size under us, and pipes or /proc files (size 0), work. */
    struct stat sb;
    size_t cap = 4096;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0) cap = (size_t)sb.st_size + 1;
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return kiln_errorf(KILN_ENOMEM, "%s: out of memory reading %zu bytes", path, cap);
    }
    size_t n = 0;
    for (;;) {
        if (n + 1 >= cap) { /* keep room for the NUL terminator */
            char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                close(fd);
                return kiln_errorf(KILN_ENOMEM, "%s: out of memory reading the file", path);
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0) {
            if (errno == EINTR) continue;
            int err = errno;
            free(buf);
            close(fd);
            return kiln_errorf(KILN_EIO, "%s: read failed after %zu bytes: %s", path, n, strerror(err));
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *data = buf;
    *len = n;
    return NULL;
}

/* ---- read-only mapping ---- */

kiln_error *kiln_open_regular(const char *path, int *fd, uint64_t *size) {
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0)
        return kiln_errorf(errno == ENOENT ? KILN_ENOTFOUND : KILN_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(*fd, &sb) != 0) {
        int err = errno;
        close(*fd);
        *fd = -1;
        return kiln_errorf(KILN_EIO, "%s: cannot stat: %s", path, strerror(err));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(*fd);
        *fd = -1;
        return kiln_errorf(KILN_EINVAL, "%s: not a regular file", path);
    }
    *size = (uint64_t)sb.st_size;
    return NULL;
}

kiln_error *kiln_mmap_close(int fd, const char *path, size_t size, void **map) {
    void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd); /* the mapping keeps the file alive */
    if (m == MAP_FAILED) {
        *map = NULL;
        return kiln_errorf(KILN_EIO, "%s: cannot mmap %zu bytes: %s", path, size, strerror(err));
    }
    *map = m;
    return NULL;
}

char *kiln_path_join(const char *dir, const char *name) {
    if (!dir || !*dir) return strdup(name);
    size_t dl = strlen(dir), nl = strlen(name);
    int slash = dir[dl - 1] != '/';
    char *p = malloc(dl + (size_t)slash + nl + 1);
    if (!p) return NULL;
    memcpy(p, dir, dl);
    if (slash) p[dl] = '/';
    memcpy(p + dl + slash, name, nl + 1);
    return p;
}

/* ---- atomic writing ---- */

/* The directory holding path ("." for a bare name), malloc'd. */
static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    size_t n = (size_t)(slash - path);
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, path, n);
    d[n] = 0;
    return d;
}

/* fsync a directory so that a rename inside it survives a crash. Some file
 * systems cannot fsync directories (EINVAL); there is nothing more we can do
 * there, so that is not an error. */
static kiln_error *fsync_dir(const char *path) {
    char *dir = dir_of(path);
    if (!dir) return kiln_errorf(KILN_ENOMEM, "%s: out of memory", path);
    kiln_error *e = NULL;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        e = kiln_errorf(KILN_EIO, "%s: written, but cannot open directory %s to sync it: %s", path, dir,
                        strerror(errno));
    } else {
        if (fsync(fd) != 0 && errno != EINVAL)
            e = kiln_errorf(KILN_EIO, "%s: written, but syncing directory %s failed: %s", path, dir,
                            strerror(errno));
        close(fd);
    }
    free(dir);
    return e;
}

kiln_error *kiln_atomic_begin(kiln_atomic_file *f, const char *path) {
    f->fd = -1;
    f->map = NULL, f->map_len = 0, f->off = 0;
    f->path = strdup(path);
    int n = snprintf(NULL, 0, "%s.tmp.%ld", path, (long)getpid());
    f->tmp_path = n < 0 ? NULL : malloc((size_t)n + 1);
    if (!f->path || !f->tmp_path) {
        free(f->path);
        free(f->tmp_path);
        f->path = f->tmp_path = NULL;
        return kiln_errorf(KILN_ENOMEM, "%s: out of memory", path);
    }
    snprintf(f->tmp_path, (size_t)n + 1, "%s.tmp.%ld", path, (long)getpid());
    /* O_EXCL so we never write through a symlink or into someone else's file.
     * A leftover temp with our pid can only come from an earlier process that
     * died (pids are reused, especially in containers): remove it and retry. */
    for (int attempt = 0; attempt < 2; attempt++) {
        f->fd = open(f->tmp_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666); /* read too: a shared mapping needs it */
        if (f->fd >= 0 || errno != EEXIST || attempt > 0) break;
        if (unlink(f->tmp_path) != 0) break;
    }
    if (f->fd < 0) {
        kiln_error *e = kiln_errorf(KILN_EIO, "%s: cannot create temp file %s: %s", path, f->tmp_path,
                                    strerror(errno));
        free(f->path);
        free(f->tmp_path);
        f->path = f->tmp_path = NULL;
        return e;
    }
    return NULL;
}

static size_t env_size(const char *name, size_t dflt) {
    const char *v = getenv(name);
    char *end = NULL;
    unsigned long long x = v && *v ? strtoull(v, &end, 10) : 0;
    return v && *v && end && !*end ? (size_t)x : dflt;
}

/* File systems where fallocate's blocks back every page of a shared mapping: tmpfs, ext4, XFS. Elsewhere
 * (copy-on-write file systems such as btrfs, which may still need space when a page is first written;
 * network file systems; overlays over any of these) a full disk could surface as a SIGBUS in the copy,
 * killing training instead of failing the save: those keep the write() path. */
int kiln_fs_maps_safely(int fd) {
    struct statfs sf;
    if (fstatfs(fd, &sf) != 0) return 0;
    switch ((unsigned long)sf.f_type) {
    case 0x01021994UL: /* TMPFS_MAGIC */
    case 0xEF53UL:     /* EXT4_SUPER_MAGIC (ext2/3/4) */
    case 0x58465342UL: /* XFS_SUPER_MAGIC */
        return 1;
    default:
        return 0;
    }
}

/* kiln_atomic_begin_sized and kiln_atomic_begin_mapped: mapped from min_map bytes on */
static kiln_error *begin_sized(kiln_atomic_file *f, const char *path, uint64_t size, size_t min_map) {
    KILN_TRY(kiln_atomic_begin(f, path));
    if (size < min_map || size > SIZE_MAX || !kiln_fs_maps_safely(f->fd)) return NULL;
    /* fallocate rather than ftruncate: a page of a sparse mapping that the file system cannot back
     * would be a SIGBUS in the middle of the copy; allocated blocks cannot run out. Where it is not
     * supported (or the disk is full, or a file-size limit is hit) the plain write() path below
     * reports what happens, as it always did. */
    if (fallocate(f->fd, 0, 0, (off_t)size) != 0) return NULL;
    void *m = mmap(NULL, (size_t)size, PROT_WRITE, MAP_SHARED, f->fd, 0);
    if (m == MAP_FAILED) {
        if (ftruncate(f->fd, 0) != 0) { /* back to an empty file for the write() path */
            kiln_error *e = kiln_errorf(KILN_EIO, "%s: cannot truncate %s: %s", path, f->tmp_path, strerror(errno));
            kiln_atomic_abort(f);
            return e;
        }
        return NULL;
    }
    f->map = m, f->map_len = (size_t)size, f->off = 0;
    return NULL;
}

kiln_error *kiln_atomic_begin_sized(kiln_atomic_file *f, const char *path, uint64_t size) {
    return begin_sized(f, path, size, env_size("KILN_WRITE_MMAP_MIN", (size_t)256 << 20));
}

kiln_error *kiln_atomic_begin_mapped(kiln_atomic_file *f, const char *path, uint64_t size) {
    return begin_sized(f, path, size, 0);
}

typedef struct {
    unsigned char *dst;
    const unsigned char *src;
    size_t len;
} copy_part;

static void *copy_run(void *arg) {
    copy_part *c = arg;
    memcpy(c->dst, c->src, c->len);
    return NULL;
}

/* Mapped mode: the copy is the write (page faults allocate the page-cache pages; on tmpfs that is
 * most of the cost), so large pieces are copied by several threads. */
static kiln_error *mapped_write(kiln_atomic_file *f, const void *data, size_t len) {
    if (len > f->map_len - f->off)
        return kiln_errorf(KILN_EINVAL, "%s: %zu bytes written at byte %zu of a file sized %zu", f->path, len, f->off,
                           f->map_len);
    enum { MAXT = 16 };
    size_t nt = env_size("KILN_WRITE_THREADS", 4);
    if (nt < 1) nt = 1;
    if (nt > MAXT) nt = MAXT;
    if (len < ((size_t)8 << 20)) nt = 1;
    copy_part part[MAXT];
    pthread_t tid[MAXT];
    int started[MAXT] = {0};
    const size_t per = (len / nt + 4095) & ~(size_t)4095;
    size_t at = 0, k = 0;
    for (; k < nt && at < len; k++) {
        part[k] = (copy_part){f->map + f->off + at, (const unsigned char *)data + at, len - at < per ? len - at : per};
        at += part[k].len;
        if (k > 0) started[k] = pthread_create(&tid[k], NULL, copy_run, &part[k]) == 0;
    }
    copy_run(&part[0]);
    for (size_t i = 1; i < k; i++) {
        if (started[i]) pthread_join(tid[i], NULL);
        else copy_run(&part[i]);
    }
    f->off += len;
    return NULL;
}

kiln_error *kiln_atomic_write(kiln_atomic_file *f, const void *data, size_t len) {
    if (f->map) return mapped_write(f, data, len);
    const char *p = data;
    while (len > 0) {
        /* Linux writes at most ~2 GiB per call; ask for 1 GiB at a time. */
        size_t chunk = len < ((size_t)1 << 30) ? len : ((size_t)1 << 30);
        ssize_t w = write(f->fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return kiln_errorf(KILN_EIO, "%s: write to %s failed: %s", f->path, f->tmp_path, strerror(errno));
        }
        if (w == 0) /* should not happen for regular files; do not spin */
            return kiln_errorf(KILN_EIO, "%s: write to %s made no progress (disk full?)", f->path, f->tmp_path);
        p += w;
        len -= (size_t)w;
    }
    return NULL;
}

void kiln_atomic_abort(kiln_atomic_file *f) {
    if (f->map) munmap(f->map, f->map_len);
    f->map = NULL;
    if (f->fd >= 0) close(f->fd);
    if (f->tmp_path) unlink(f->tmp_path);
    free(f->path);
    free(f->tmp_path);
    f->fd = -1;
    f->path = f->tmp_path = NULL;
}

kiln_error *kiln_atomic_commit(kiln_atomic_file *f) {
    kiln_error *e = NULL;
    if (f->map) { /* the mapping's dirty pages belong to the file: unmapped here, written back by the fsync */
        const size_t written = f->off, size = f->map_len;
        munmap(f->map, f->map_len);
        f->map = NULL;
        if (written != size) {
            e = kiln_errorf(KILN_EIO, "%s: %zu bytes written of the %zu the file was sized for", f->path, written, size);
            kiln_atomic_abort(f);
            return e;
        }
    }
    /* fsync before rename: otherwise a crash can leave the new name pointing
     * at a file whose data never reached the disk. close() is checked too
     * because network file systems report write errors there. */
    if (fsync(f->fd) != 0) {
        e = kiln_errorf(KILN_EIO, "%s: fsync of %s failed: %s", f->path, f->tmp_path, strerror(errno));
    } else {
        int rc = close(f->fd);
        f->fd = -1;
        if (rc != 0)
            e = kiln_errorf(KILN_EIO, "%s: close of %s failed: %s", f->path, f->tmp_path, strerror(errno));
        else if (rename(f->tmp_path, f->path) != 0)
            e = kiln_errorf(KILN_EIO, "%s: cannot rename %s into place: %s", f->path, f->tmp_path,
                            strerror(errno));
    }
    if (e) {
        kiln_atomic_abort(f);
        return e;
    }
    /* The data is in place; only the durability of the rename is left. */
    e = fsync_dir(f->path);
    free(f->path);
    free(f->tmp_path);
    f->path = f->tmp_path = NULL;
    return e;
}

kiln_error *kiln_write_file_atomic(const char *path, const void *data, size_t len) {
    kiln_atomic_file f;
    KILN_TRY(kiln_atomic_begin(&f, path));
    kiln_error *e = kiln_atomic_write(&f, data, len);
    if (e) {
        kiln_atomic_abort(&f);
        return e;
    }
    return kiln_atomic_commit(&f);
}

/* ---- directories ---- */

kiln_error *kiln_mkdir(const char *path) {
    if (mkdir(path, 0755) && errno != EEXIST) return kiln_errorf(KILN_EIO, "%s: cannot create: %s", path, strerror(errno));
    return NULL;
}

kiln_error *kiln_mkdirs(const char *path) {
    char *p = strdup(path ? path : "");
    kiln_error *e = NULL;
    if (!p) return kiln_errorf(KILN_ENOMEM, "%s: out of memory", path);
    if (!*p) e = kiln_errorf(KILN_EINVAL, "an empty directory name");
    for (char *s = p + 1; !e && *s; s++) /* each parent, then the whole path */
        if (*s == '/' && s[-1] != '/') {
            *s = 0;
            e = kiln_mkdir(p);
            *s = '/';
        }
    if (!e) e = kiln_mkdir(p);
    free(p);
    return e;
}

kiln_error *kiln_fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kiln_errorf(KILN_EIO, "%s: cannot open: %s", path, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    return rc ? kiln_errorf(KILN_EIO, "%s: fsync: %s", path, strerror(errno)) : NULL;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

void kiln_rm_tree(const char *path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

kiln_error *kiln_dir_names(const char *dir, int (*keep)(const char *name), char ***names_out, size_t *n_out) {
    *names_out = NULL, *n_out = 0;
    DIR *d = opendir(dir);
    if (!d) return kiln_errorf(KILN_EIO, "%s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0;
    kiln_error *e = NULL;
    struct dirent *de;
    while (!e && (de = readdir(d))) {
        if (!keep(de->d_name)) continue;
        char **nn = realloc(names, (n + 1) * sizeof *nn);
        if (nn) names = nn;
        if (!nn || !(names[n] = strdup(de->d_name))) e = kiln_errorf(KILN_ENOMEM, "%s: out of memory", dir);
        else n++;
    }
    closedir(d);
    if (e) {
        kiln_dir_names_free(names, n);
        return e;
    }
    if (n) qsort(names, n, sizeof *names, cmp_name);
    *names_out = names, *n_out = n;
    return NULL;
}

void kiln_dir_names_free(char **names, size_t n) {
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
}
