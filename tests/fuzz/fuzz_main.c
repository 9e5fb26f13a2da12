/* libFuzzer's entry points for kiln's fuzz targets: KILN_FUZZ_TARGET names the target (docs/fuzzing.md), e.g.
 *   KILN_FUZZ_TARGET=safetensors ./build-fuzz/kiln_fuzz -max_total_time=600 fuzz-work tests/fuzz/corpus/safetensors
 * A target's failed invariant aborts, so that libFuzzer keeps the input as a crash. */
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_targets.h"

static const kiln_fuzz_target *target;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *name = getenv("KILN_FUZZ_TARGET");
    if (!name || !(target = kiln_fuzz_find(name))) {
        fprintf(stderr, "kiln_fuzz: set KILN_FUZZ_TARGET to one of:\n");
        for (const kiln_fuzz_target *t = kiln_fuzz_targets; t->name; t++) fprintf(stderr, "  %-15s %s\n", t->name, t->what);
        exit(2);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (target->fn(data, size)) abort();
    return 0;
}
