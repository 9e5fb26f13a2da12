/* The fuzz targets (tests/fuzz) over their committed corpora: the seeds, and every input a fuzzing run found
 * to grow coverage or to crash (kept after the fix). Under CI's AddressSanitizer/UBSan build a memory error in
 * any parser on any of them fails the suite; in every build a broken round trip or an error without a message
 * does. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_targets.h"
#include "kiln/fsutil.h"
#include "test.h"

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

TEST(fuzz_corpora_replay_clean) {
    for (const kiln_fuzz_target *t = kiln_fuzz_targets; t->name; t++) {
        char rel[128];
        snprintf(rel, sizeof rel, "tests/fuzz/corpus/%s", t->name);
        char dir[1024]; /* test_src_path's buffer is reused */
        snprintf(dir, sizeof dir, "%s", test_src_path(rel));
        DIR *d = opendir(dir);
        CHECK_MSG(d, "no corpus for fuzz target '%s' (%s)", t->name, dir);
        if (!d) continue;
        char **names = NULL;
        size_t n = 0, cap = 0;
        for (struct dirent *de; (de = readdir(d));) {
            if (de->d_name[0] == '.') continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                char **g = realloc(names, cap * sizeof *names);
                if (!g) break;
                names = g;
            }
            names[n++] = strdup(de->d_name);
        }
        closedir(d);
        qsort(names, n, sizeof *names, cmp_str);
        CHECK_MSG(n >= 3, "fuzz target '%s': only %zu inputs in its corpus", t->name, n);
        for (size_t i = 0; i < n; i++) {
            char *data = NULL;
            size_t len = 0;
            kiln_error *e = kiln_read_file(test_join(dir, names[i]), &data, &len);
            CHECK_OK(e);
            if (!e) CHECK_MSG(t->fn((const uint8_t *)data, len) == 0, "fuzz target '%s' fails on %s/%s", t->name, rel, names[i]);
            free(data);
            free(names[i]);
        }
        free(names);
    }
}
