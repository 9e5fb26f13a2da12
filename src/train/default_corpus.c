/* The built-in corpus of the default run: short stories generated from a small grammar, so that
 * kiln ships with training text it may redistribute and a tiny model can learn to write
 * readable English within minutes on a laptop. Deterministic from the seed. */
#include <stdio.h>
#include <string.h>

#include "kiln/fsutil.h"
#include "kiln/rng.h"
#include "kiln/train.h"

#define PICK(r, a) (a[kiln_rng_u64(r) % (sizeof a / sizeof a[0])])

static const char *names[] = {"Anna", "Ben", "Clara", "David", "Ella", "Finn", "Grace", "Hugo", "Iris", "Jack",
                              "Kira", "Leo", "Maya", "Nora", "Omar", "Pia", "Ravi", "Sara", "Tom", "Vera"};
static const char *animals[] = {"cat", "dog", "fox", "owl", "horse", "rabbit", "duck", "goat", "mouse", "bird"};
static const char *objects[] = {"a red ball", "a small boat", "an old book", "a blue kite", "a warm coat",
                                "a wooden box", "a silver key", "a loaf of bread", "a green hat", "a paper map",
                                "a jar of honey", "a yellow umbrella"};
static const char *places[] = {"the park", "the river", "the market", "the forest", "the school", "the garden",
                               "the harbor", "the old mill", "the library", "the hill", "the bakery", "the beach"};
static const char *times[] = {"In the morning", "On Sunday", "After lunch", "Late in the evening", "One cold winter day",
                              "On a sunny afternoon", "Before breakfast", "At noon"};
static const char *weathers[] = {"raining", "very windy", "warm and bright", "cold", "foggy", "snowing"};
static const char *feelings[] = {"happy", "tired", "proud", "calm", "hungry", "glad", "sleepy", "excited"};
static const char *numbers[] = {"two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"};
static const char *foods[] = {"apples", "soup", "bread and cheese", "warm pancakes", "rice", "a big cake"};

/* One story of 5-9 sentences about two friends. */
static size_t story(kiln_rng *r, char *buf, size_t cap) {
    const char *a = PICK(r, names), *b = PICK(r, names), *pet = PICK(r, animals), *obj = PICK(r, objects);
    const char *place = PICK(r, places), *place2 = PICK(r, places);
    while (b == a) b = PICK(r, names);
    size_t n = 0;
#define S(...) (n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__))
    S("%s, %s went to %s with %s %s. ", PICK(r, times), a, place, "the", pet);
    int k = 3 + (int)(kiln_rng_u64(r) % 5);
    for (int i = 0; i < k; i++) {
        switch (kiln_rng_u64(r) % 9) {
        case 0: S("There %s found %s. ", a, obj); break;
        case 1: S("%s gave %s to %s. %s smiled and said, \"Thank you, %s!\" ", a, obj, b, b, a); break;
        case 2: S("The %s ran after %s. ", pet, obj); break;
        case 3: S("It was %s, so they walked to %s. ", PICK(r, weathers), place2); break;
        case 4: S("They saw %s %ss near %s. ", PICK(r, numbers), PICK(r, animals), place2); break;
        case 5: S("%s asked %s, \"Do you want some %s?\" ", b, a, PICK(r, foods)); break;
        case 6: S("%s and %s ate %s at %s. ", a, b, PICK(r, foods), place); break;
        case 7: S("%s felt %s and sat down by %s. ", b, PICK(r, feelings), place2); break;
        default: S("%s showed %s %s that %s had kept for a long time. ", a, b, obj, a); break;
        }
    }
    S("At the end of the day, %s and %s went home, %s and %s.", a, b, PICK(r, feelings), PICK(r, feelings));
#undef S
    return n < cap ? n : cap - 1;
}

kiln_error *kiln_default_corpus_write(const char *path, int64_t stories, uint64_t seed) {
    kiln_atomic_file f;
    KILN_TRY(kiln_atomic_begin(&f, path));
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    char text[4096], line[4400];
    kiln_error *e = NULL;
    for (int64_t i = 0; !e && i < stories; i++) {
        story(&r, text, sizeof text);
        int n = snprintf(line, sizeof line, "{\"text\": \"");
        for (char *p = text; *p && n < (int)sizeof line - 8; p++) {
            if (*p == '"' || *p == '\\') line[n++] = '\\';
            line[n++] = *p;
        }
        n += snprintf(line + n, sizeof line - (size_t)n, "\"}\n");
        e = kiln_atomic_write(&f, line, (size_t)n);
    }
    if (e) {
        kiln_atomic_abort(&f);
        return e;
    }
    return kiln_atomic_commit(&f);
}
