/* A persistent cache of timing-based choices (which of cuBLASLt's candidate algorithms a GEMM shape runs
 * fastest with on this machine), so that a machine pays for the timing once and every later process makes the
 * same choice (the same bits). A text file of "key<TAB>value" lines; every store rewrites it atomically
 * (kiln_write_file_atomic), so a crash or a full disk leaves the old file. Lines that do not parse are skipped
 * on reading and dropped on the next store: a damaged cache costs a re-timing, never a wrong pick, because
 * callers check a value against what they can choose from. Concurrent writers: the last rename wins and the
 * other's new entries are timed again next time. */
#ifndef KILN_TUNE_CACHE_H
#define KILN_TUNE_CACHE_H

#include "kiln/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The cache file `name` in $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln (the directory
 * is created). *path: malloc'd. An error when none of the three is set or the directory cannot be made. */
kiln_error *kiln_tune_cache_path(const char *name, char **path);
/* The value stored for key: *found 0 when the file or the key is missing (not an error); an error when the
 * file exists but cannot be read. key: printable, without tabs or newlines. */
kiln_error *kiln_tune_cache_get(const char *path, const char *key, long *value, int *found);
/* Store key = value (replacing the key's line, keeping the others' order), atomically. */
kiln_error *kiln_tune_cache_put(const char *path, const char *key, long value);

#ifdef __cplusplus
}
#endif
#endif
