/* The texts a run embeds with CLIP, and for every (prompt, component) which of them the judge
 * compares: the component phrase against its contrasts. Built from the suite alone, so it is
 * the same for scoring, the superposition analysis and the report. */
#ifndef KILN_CIS_TEXTSET_H
#define KILN_CIS_TEXTSET_H

#include "kiln/cis.h"

typedef struct {
    int text;       /* "a photo of <phrase>" */
    int *contrast;  /* generic counterpart, absence phrase, other cultures' equivalents */
    int ncontrast;
    int generic;    /* "a photo of <generic>" or -1 */
} cis_comp_texts;

typedef struct {
    int ntext;
    char **text;          /* unique texts */
    cis_comp_texts **pc;  /* [prompt][component] */
    int *context, *generic_context; /* per prompt; generic_context -1 when the suite has none */
} cis_textset;

/* The absence phrase: CLIP reads negations poorly ("a photo with no injera" still matches
 * injera), so absence is the bare caption. */
#define CIS_ABSENCE_TEXT "a photo"

kiln_error *cis_textset_build(const kiln_cis_suite *s, cis_textset *ts);
void cis_textset_free(cis_textset *ts, const kiln_cis_suite *s);

#endif
