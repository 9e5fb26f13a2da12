/* File-system helpers: whole-file reads, read-only mappings, path joining, and atomic writes.
 *
 * Atomic write protocol (used by every writer in kiln, e.g. the safetensors
 * writer): write to "<path>.tmp.<pid>" in the same directory, fsync it, close
 * it, rename() it over <path>, then fsync the directory so the rename itself
 * is durable. A reader therefore sees either the old file or the complete new
 * one, never a torn file. On any failure before the rename the temp file is
 * unlinked and <path> is untouched.
 *
 * Error messages name the path and the OS reason (strerror).
 */
#ifndef KILN_FSUTIL_H
#define KILN_FSUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Read a whole file into a malloc'd buffer. *data gets one extra NUL byte
 * after the contents (not counted in *len) so text can be used as a C string.
 * On error *data is NULL and *len is 0 (KILN_ENOTFOUND when the file does not
 * exist). Free *data with free(). */
kiln_error *kiln_read_file(const char *path, char **data, size_t *len);

/* Open path read-only for mapping; it must be a regular file. *fd gets the open
 * descriptor and *size the file's size. Errors name the path: KILN_ENOTFOUND when
 * it does not exist, KILN_EIO when it cannot be opened or stat'ed, KILN_EINVAL
 * when it is not a regular file (nothing is left open then). */
kiln_error *kiln_open_regular(const char *path, int *fd, uint64_t *size);

/* Map size bytes of fd read-only (PROT_READ, MAP_PRIVATE: pages load on first
 * touch) and close fd in every case: the mapping keeps the file alive. Release
 * it with munmap(*map, size). path is for the message. */
kiln_error *kiln_mmap_close(int fd, const char *path, size_t size, void **map);

/* "dir" + "/" + "name" as a malloc'd string (no doubled '/'; an empty or NULL
 * dir gives a copy of name). Plain string concatenation: ".." and absolute
 * names are not interpreted. Returns NULL only when out of memory. */
char *kiln_path_join(const char *dir, const char *name);
/* The names of dir's entries that keep(name) accepts, sorted by strcmp (malloc'd; free with
 * kiln_dir_names_free). Not filtered by type: the caller stats what it opens. */
kiln_error *kiln_dir_names(const char *dir, int (*keep)(const char *name), char ***names, size_t *n);
void kiln_dir_names_free(char **names, size_t n);

/* Create one directory level (an existing one is fine). */
kiln_error *kiln_mkdir(const char *path);
/* Create a directory and its missing parents (mkdir -p). */
kiln_error *kiln_mkdirs(const char *path);
/* fsync a file or a directory by name (a directory: so that renames inside it are durable). */
kiln_error *kiln_fsync_path(const char *path);
/* Remove a file or a directory tree, best effort (temporary and rejected checkpoint directories). */
void kiln_rm_tree(const char *path);

/* Write len bytes to path atomically (see the protocol above). */
kiln_error *kiln_write_file_atomic(const char *path, const void *data, size_t len);

/* The pieces of the protocol, for writers that stream their output:
 *
 *   kiln_atomic_file f;
 *   KILN_TRY(kiln_atomic_begin(&f, path));
 *   if ((e = kiln_atomic_write(&f, a, na)) || (e = kiln_atomic_write(&f, b, nb))) {
 *       kiln_atomic_abort(&f);
 *       return e;
 *   }
 *   return kiln_atomic_commit(&f);
 *
 * commit and abort both release everything; abort is a no-op after commit. */
typedef struct {
    char *path;     /* final destination */
    char *tmp_path; /* "<path>.tmp.<pid>"; NULL once committed or aborted */
    int fd;         /* open temp file, or -1 */
    /* kiln_atomic_begin_sized's mapped mode: the file's blocks allocated up front, data copied into a
     * shared mapping by several threads (one buffered write() stream is serialised by the inode lock) */
    unsigned char *map;
    size_t map_len, off;
} kiln_atomic_file;

kiln_error *kiln_atomic_begin(kiln_atomic_file *f, const char *path);
/* The same for a file whose final size is known: a file of at least KILN_WRITE_MMAP_MIN bytes (default
 * 256 MiB; environment variable) is allocated whole (fallocate: a full disk fails here, before any data)
 * and written through a shared mapping, large writes split over KILN_WRITE_THREADS threads (default 4),
 * on tmpfs, ext4 and XFS. Elsewhere, or where the file system cannot allocate or map the file, it falls
 * back to plain writes; the writes must
 * then add up to exactly size bytes. */
kiln_error *kiln_atomic_begin_sized(kiln_atomic_file *f, const char *path, uint64_t size);
/* The same whatever the size: mapped wherever the file system allows (`kiln bench io`'s seq_write_mapped). */
kiln_error *kiln_atomic_begin_mapped(kiln_atomic_file *f, const char *path, uint64_t size);
/* Whether the file system of fd is one where kiln_atomic_begin_sized maps files (tmpfs, ext4, XFS). */
int kiln_fs_maps_safely(int fd);
/* Write everything or fail (retries short writes and EINTR; ENOSPC, EFBIG,
 * EIO... become errors naming the path). Does not abort on failure. */
kiln_error *kiln_atomic_write(kiln_atomic_file *f, const void *data, size_t len);
/* fsync, close, rename over the destination, fsync the directory. On failure
 * before the rename the temp file is removed and the destination untouched. */
kiln_error *kiln_atomic_commit(kiln_atomic_file *f);
/* Close and unlink the temp file. */
void kiln_atomic_abort(kiln_atomic_file *f);

#ifdef __cplusplus
}
#endif
#endif
