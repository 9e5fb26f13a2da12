/* CLIP's text ids: tokenizer.json through kiln's tokenizer (NFC, whitespace collapsing, Lowercase,
 * CLIP's split regex, ByteLevel, BPE with the "</w>" end-of-word suffix), then what the
 * post-processor adds - <|startoftext|> ... <|endoftext|> - with the content truncated so the
 * whole fits max_position_embeddings (HF: truncation=True, max_length=77). */
#include <stdlib.h>
#include <string.h>

#include "clip/clip_internal.h"
#include "kiln/fsutil.h"
#include "kiln/json.h"
#include "kiln/log.h"

/* [token, id] of a Roberta/Bert processor's cls or sep */
static int64_t pair_id(const cJSON *pp, const char *key) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(pp, key);
    int64_t id = -1;
    return cJSON_IsArray(a) && kiln_json_int_value(cJSON_GetArrayItem(a, 1), &id) ? id : -1;
}

/* TemplateProcessing: the id of the special token at the start (first = 1) or end of "single" */
static int64_t template_id(const cJSON *pp, int first) {
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(pp, "special_tokens");
    int n = cJSON_IsArray(single) ? cJSON_GetArraySize(single) : 0;
    if (n < 2) return -1;
    const cJSON *it = cJSON_GetArrayItem(single, first ? 0 : n - 1);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(st, "id");
    if (!cJSON_IsString(name)) return -1;
    const cJSON *ent = cJSON_GetObjectItemCaseSensitive(sp, name->valuestring);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(ent, "ids");
    int64_t id = -1;
    return cJSON_IsArray(ids) && kiln_json_int_value(cJSON_GetArrayItem(ids, 0), &id) ? id : -1;
}

kiln_error *kiln_clip_load_text(kiln_clip *m) {
    char *path = kiln_path_join(m->dir, "tokenizer.json");
    if (!path) return kiln_errorf(KILN_ENOMEM, "out of memory");
    kiln_error *e = kiln_tokenizer_load(path, &m->tok);
    cJSON *root = NULL;
    if (!e) e = kiln_json_parse_file(path, &root);
    m->bos_id = m->eos_id = -1;
    if (!e) {
        const cJSON *pp = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
        const cJSON *type = pp ? cJSON_GetObjectItemCaseSensitive(pp, "type") : NULL;
        const char *ty = cJSON_IsString(type) ? type->valuestring : "";
        if (!strcmp(ty, "RobertaProcessing") || !strcmp(ty, "BertProcessing")) {
            m->bos_id = pair_id(pp, "cls");
            m->eos_id = pair_id(pp, "sep");
        } else if (!strcmp(ty, "TemplateProcessing")) {
            m->bos_id = template_id(pp, 1);
            m->eos_id = template_id(pp, 0);
        }
        /* no (usable) post-processor: CLIP's own names */
        if (m->bos_id < 0) m->bos_id = kiln_tokenizer_token_id(m->tok, "<|startoftext|>");
        if (m->eos_id < 0) m->eos_id = kiln_tokenizer_token_id(m->tok, "<|endoftext|>");
        int64_t V = kiln_tokenizer_vocab_size(m->tok);
        if (m->bos_id < 0 || m->eos_id < 0)
            e = kiln_errorf(KILN_EFORMAT, "%s: cannot find the start/end tokens (<|startoftext|>, <|endoftext|>)", path);
        else if (V > m->text.vocab || m->bos_id >= m->text.vocab || m->eos_id >= m->text.vocab)
            e = kiln_errorf(KILN_EFORMAT, "%s: the tokenizer has %lld ids, text_config.vocab_size is %lld", path,
                            (long long)V, (long long)m->text.vocab);
        else if (m->text.eos_token_id != 2 && m->text.eos_token_id != m->eos_id)
            /* HF's rule, kept (kiln_clip_eos_index), but the embeddings then pool a text's first token: a config
             * without its eos_token_id (49407 by default) beside a smaller vocabulary does that */
            kiln_log(KILN_LOG_WARN, "%s/config.json: text_config.eos_token_id %lld is not the tokenizer's end token "
                     "%lld: texts are pooled at their first token, as transformers does with this config", m->dir,
                     (long long)m->text.eos_token_id, (long long)m->eos_id);
    }
    cJSON_Delete(root);
    free(path);
    return e;
}

kiln_error *kiln_clip_text_ids(const kiln_clip *m, const char *text, int64_t **ids, int *n) {
    int64_t *tok = NULL;
    size_t nt = 0;
    *ids = NULL;
    *n = 0;
    KILN_TRY(kiln_tokenizer_encode(m->tok, text, strlen(text), &tok, &nt));
    size_t keep = nt < (size_t)m->text.max_pos - 2 ? nt : (size_t)m->text.max_pos - 2;
    int64_t *v = malloc(sizeof(int64_t) * (keep + 2));
    if (!v) {
        free(tok);
        return kiln_errorf(KILN_ENOMEM, "out of memory");
    }
    v[0] = m->bos_id;
    if (keep) memcpy(v + 1, tok, keep * sizeof(int64_t));
    v[keep + 1] = m->eos_id;
    free(tok);
    *ids = v;
    *n = (int)keep + 2;
    return NULL;
}

/* HF 5.x CLIPTextTransformer: with the legacy eos_token_id == 2 it pools at argmax(input_ids) (the
 * real <|endoftext|> has the largest id); otherwise at the first position holding eos_token_id
 * (position 0 if none). Padding comes after, so the unpadded ids give the same position. */
int kiln_clip_eos_index(const kiln_clip *m, const int64_t *ids, int n) {
    int best = 0;
    if (m->text.eos_token_id == 2) {
        for (int i = 1; i < n; i++)
            if (ids[i] > ids[best]) best = i;
        return best;
    }
    for (int i = 0; i < n; i++)
        if (ids[i] == m->text.eos_token_id) return i;
    return 0;
}
