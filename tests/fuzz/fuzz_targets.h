/* kiln's fuzz targets: every parser that reads a user's bytes (files and flags), driven by libFuzzer
 * (tests/fuzz/fuzz_main.c, `cmake -DKILN_FUZZ=ON` with clang: docs/fuzzing.md) and replayed over the
 * committed corpora by the ordinary test suite (tests/test_fuzz_corpus.c), so a crash found once stays
 * found.
 *
 * A target takes any bytes. Bad input must come back as an error (the library never exits or aborts on
 * it); the sanitizers catch memory errors; and where a parser has a writer or an inverse, the target
 * checks the round trip (what was accepted is written, read back and compared). A target returns 0, or
 * -1 after printing which invariant failed. */
#ifndef KILN_FUZZ_TARGETS_H
#define KILN_FUZZ_TARGETS_H

#include <stddef.h>
#include <stdint.h>

typedef int (*kiln_fuzz_fn)(const uint8_t *data, size_t size);

typedef struct {
    const char *name; /* also the corpus folder: tests/fuzz/corpus/<name>/ */
    kiln_fuzz_fn fn;
    const char *what;
} kiln_fuzz_target;

/* NULL-name terminated */
extern const kiln_fuzz_target kiln_fuzz_targets[];
const kiln_fuzz_target *kiln_fuzz_find(const char *name);

#endif
