/* Typed, error-reporting accessors over cJSON. See include/kiln/json.h. */
#include "kiln/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/fsutil.h"

/* "ctx: " or "" so messages read the same with and without a context. */
#define CTX_FMT "%s%s"
#define CTX_ARGS(ctx) ((ctx) ? (ctx) : ""), ((ctx) ? ": " : "")

static int is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* 1-based line and column (in bytes) of text[pos]. */
static void line_col(const char *text, size_t pos, size_t *line, size_t *col) {
    size_t l = 1, last_nl = 0;
    int seen_nl = 0;
    for (size_t i = 0; i < pos; i++) {
        if (text[i] == '\n') {
            l++;
            last_nl = i;
            seen_nl = 1;
        }
    }
    *line = l;
    *col = seen_nl ? pos - last_nl : pos + 1;
}

/* An error at text[pos], quoting a few bytes there so the user can find it. */
static kiln_error *syntax_error(const char *text, size_t len, size_t pos, const char *what, const char *ctx) {
    size_t line, col;
    line_col(text, pos, &line, &col);
    char near[24];
    size_t k = 0;
    for (size_t i = pos; i < len && k < 16 && text[i] != '\n'; i++)
        near[k++] = (text[i] >= 0x20 && text[i] < 0x7f) ? text[i] : '?';
    near[k] = 0;
    if (pos >= len)
        return kiln_errorf(KILN_EFORMAT, CTX_FMT "%s at line %zu, column %zu (at end of input)", CTX_ARGS(ctx),
                           what, line, col);
    return kiln_errorf(KILN_EFORMAT, CTX_FMT "%s at line %zu, column %zu (near '%s')", CTX_ARGS(ctx), what, line,
                       col, near);
}

/* Where cJSON gave up on text[0, len), as an offset; len means "ran out of
 * input". The parse-end pointer is the position cJSON_GetErrorPtr() reports,
 * but per call, so this is safe from several threads. */
static size_t error_offset(const char *text, size_t len) {
    const char *end = NULL;
    cJSON_Delete(cJSON_ParseWithLengthOpts(text, len, &end, 0));
    size_t pos = (end && end >= text && end <= text + len) ? (size_t)(end - text) : 0;
    if (len == 0 || pos + 1 < len) return pos;
    /* cJSON reports running out of input as an error at the last byte, which
     * is ambiguous ("[1,]" fails at the last byte too). Parse again with a
     * byte appended that no JSON can contain there: if that is where it now
     * stops, the real problem was the end of the input. */
    char *copy = malloc(len + 1);
    if (!copy) return pos;
    memcpy(copy, text, len);
    copy[len] = '\x01';
    end = NULL;
    cJSON_Delete(cJSON_ParseWithLengthOpts(copy, len + 1, &end, 0));
    size_t pos2 = end ? (size_t)(end - copy) : pos;
    free(copy);
    return pos2 >= len ? len : pos;
}

/* The first number in the tree that is not finite (written beyond the double range, as 1e999: cJSON reads it as
 * inf, which no field of kiln's means, and which cJSON would write back as null), with its path, e.g.
 * "model.rope_theta" or "[3].x"; NULL when there is none. */
static const cJSON *nonfinite(const cJSON *item, char *path, size_t cap, size_t at) {
    if (cJSON_IsNumber(item)) return isfinite(item->valuedouble) ? NULL : item;
    if (!cJSON_IsArray(item) && !cJSON_IsObject(item)) return NULL;
    int i = 0;
    for (const cJSON *c = item->child; c; c = c->next, i++) {
        int w = c->string ? snprintf(path + at, cap - at, "%s%s", at ? "." : "", c->string)
                          : snprintf(path + at, cap - at, "[%d]", i);
        const size_t next = w < 0 || (size_t)w >= cap - at ? cap - 1 : at + (size_t)w;
        const cJSON *bad = nonfinite(c, path, cap, next);
        if (bad) return bad;
        path[at] = 0;
    }
    return NULL;
}

kiln_error *kiln_json_parse(const char *text, size_t len, const char *ctx, cJSON **out) {
    *out = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        size_t pos = error_offset(text, len);
        if (pos >= len) return syntax_error(text, len, len, "invalid JSON: unexpected end", ctx);
        return syntax_error(text, len, pos, "invalid JSON", ctx);
    }
    /* require_null_terminated=0 lets cJSON stop after the first value; only
     * whitespace may follow ("{} {}" or "{}x" is not a JSON document). */
    size_t pos = (size_t)(end - text);
    while (pos < len && is_json_space(text[pos])) pos++;
    if (pos < len) {
        cJSON_Delete(root);
        return syntax_error(text, len, pos, "invalid JSON: unexpected data after the value", ctx);
    }
    char path[256] = "";
    if (nonfinite(root, path, sizeof path, 0)) {
        cJSON_Delete(root);
        return kiln_errorf(KILN_EFORMAT, CTX_FMT "invalid JSON: the number at %s is beyond the range of a double",
                           CTX_ARGS(ctx), *path ? path : "the top level");
    }
    *out = root;
    return NULL;
}

kiln_error *kiln_json_parse_file(const char *path, cJSON **out) {
    *out = NULL;
    char *text;
    size_t len;
    KILN_TRY(kiln_read_file(path, &text, &len));
    kiln_error *e = kiln_json_parse(text, len, path, out);
    free(text);
    return e;
}

const char *kiln_json_type_name(const cJSON *item) {
    if (!item) return "nothing";
    if (cJSON_IsString(item)) return "string";
    if (cJSON_IsNumber(item)) return "number";
    if (cJSON_IsBool(item)) return "boolean";
    if (cJSON_IsNull(item)) return "null";
    if (cJSON_IsArray(item)) return "array";
    if (cJSON_IsObject(item)) return "object";
    return "invalid";
}

/* The value of field in obj, or NULL when missing or null. When a key is
 * repeated the last one wins, as in Python's json module, which wrote most
 * of the files we read. */
static const cJSON *lookup(const cJSON *obj, const char *field) {
    const cJSON *found = NULL;
    if (!obj || !cJSON_IsObject(obj)) return NULL;
    for (const cJSON *c = obj->child; c; c = c->next)
        if (c->string && strcmp(c->string, field) == 0) found = c;
    return (found && cJSON_IsNull(found)) ? NULL : found;
}

static kiln_error *missing(const char *field, const char *ctx) {
    return kiln_errorf(KILN_ENOTFOUND, CTX_FMT "missing required field '%s'", CTX_ARGS(ctx), field);
}

/* The shortest text that reads back as exactly d (100, not 1e+02; 0.30000000000000004, not 0.3); "null" for what
 * JSON cannot hold. cap >= 32. */
static void number_text(double d, char *buf, size_t cap) {
    if (!isfinite(d)) {
        snprintf(buf, cap, "null");
    } else if (d == floor(d) && fabs(d) < 1e17) {
        snprintf(buf, cap, "%.0f", d);
    } else {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, cap, "%.*g", prec, d);
            if (strtod(buf, NULL) == d) break;
        }
    }
}

/* Every number of the (copied) tree as its exact text (cJSON_Raw, printed verbatim) */
static int exact_numbers(cJSON *item) {
    for (; item; item = item->next) {
        if (cJSON_IsNumber(item)) {
            char buf[40];
            number_text(item->valuedouble, buf, sizeof buf);
            if (!(item->valuestring = strdup(buf))) return -1;
            item->type = cJSON_Raw;
        } else if (item->child && exact_numbers(item->child)) {
            return -1;
        }
    }
    return 0;
}

char *kiln_json_print(const cJSON *item, int formatted) {
    cJSON *copy = cJSON_Duplicate(item, 1); /* the item alone: a copy has no siblings */
    if (!copy) return NULL;
    char *text = exact_numbers(copy) ? NULL : formatted ? cJSON_Print(copy) : cJSON_PrintUnformatted(copy);
    cJSON_Delete(copy);
    return text;
}

const char *kiln_json_describe(const cJSON *item, char *buf, size_t cap) {
    if (cap == 0) return buf;
    if (cJSON_IsNumber(item)) {
        char t[40];
        number_text(item->valuedouble, t, sizeof t);
        snprintf(buf, cap, "%s", t);
    } else if (cJSON_IsString(item) && item->valuestring && strlen(item->valuestring) + 3 <= cap) {
        snprintf(buf, cap, "\"%s\"", item->valuestring);
    } else {
        snprintf(buf, cap, "%s", kiln_json_type_name(item));
    }
    return buf;
}

static kiln_error *wrong_type(const cJSON *v, const char *field, const char *want, const char *ctx) {
    if (cJSON_IsString(v) && v->valuestring && strlen(v->valuestring) <= 32)
        return kiln_errorf(KILN_EINVAL, CTX_FMT "field '%s' must be %s, got string \"%s\"", CTX_ARGS(ctx), field,
                           want, v->valuestring);
    return kiln_errorf(KILN_EINVAL, CTX_FMT "field '%s' must be %s, got %s", CTX_ARGS(ctx), field, want,
                       kiln_json_type_name(v));
}

int kiln_json_int_value(const cJSON *item, int64_t *out) {
    if (!cJSON_IsNumber(item)) return 0;
    const double d = item->valuedouble;
    /* cJSON stores numbers as doubles; beyond 2^53 we could not tell which integer was written, so refuse rather
     * than silently round (and the range comes before the conversion) */
    if (!(fabs(d) <= 9007199254740992.0) || d != floor(d)) return 0;
    *out = (int64_t)d;
    return 1;
}

kiln_error *kiln_json_get_int(const cJSON *obj, const char *field, int64_t *out, int64_t dflt, int required,
                              const char *ctx) {
    const cJSON *v = lookup(obj, field);
    if (!v) {
        if (required) return missing(field, ctx);
        *out = dflt;
        return NULL;
    }
    if (!cJSON_IsNumber(v)) return wrong_type(v, field, "an integer", ctx);
    if (!kiln_json_int_value(v, out)) {
        char desc[64];
        return kiln_errorf(KILN_EINVAL, CTX_FMT "field '%s' must be an integer, got %s", CTX_ARGS(ctx), field,
                           kiln_json_describe(v, desc, sizeof desc));
    }
    return NULL;
}

kiln_error *kiln_json_get_double(const cJSON *obj, const char *field, double *out, double dflt, int required,
                                 const char *ctx) {
    const cJSON *v = lookup(obj, field);
    if (!v) {
        if (required) return missing(field, ctx);
        *out = dflt;
        return NULL;
    }
    if (!cJSON_IsNumber(v)) return wrong_type(v, field, "a number", ctx);
    *out = v->valuedouble;
    return NULL;
}

kiln_error *kiln_json_get_bool(const cJSON *obj, const char *field, int *out, int dflt, int required,
                               const char *ctx) {
    const cJSON *v = lookup(obj, field);
    if (!v) {
        if (required) return missing(field, ctx);
        *out = dflt;
        return NULL;
    }
    if (!cJSON_IsBool(v)) return wrong_type(v, field, "true or false", ctx);
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return NULL;
}

kiln_error *kiln_json_get_string(const cJSON *obj, const char *field, const char **out, const char *dflt,
                                 int required, const char *ctx) {
    const cJSON *v = lookup(obj, field);
    if (!v) {
        if (required) return missing(field, ctx);
        *out = dflt;
        return NULL;
    }
    if (!cJSON_IsString(v) || !v->valuestring) return wrong_type(v, field, "a string", ctx);
    *out = v->valuestring;
    return NULL;
}

kiln_error *kiln_json_get_array(const cJSON *obj, const char *field, const cJSON **out, int required,
                                const char *ctx) {
    const cJSON *v = lookup(obj, field);
    if (!v) {
        if (required) return missing(field, ctx);
        *out = NULL;
        return NULL;
    }
    if (!cJSON_IsArray(v)) return wrong_type(v, field, "an array", ctx);
    *out = v;
    return NULL;
}

kiln_error *kiln_json_get_object(const cJSON *obj, const char *field, const cJSON **out, int required,
                                 const char *ctx) {
    const cJSON *v = lookup(obj, field);
    if (!v) {
        if (required) return missing(field, ctx);
        *out = NULL;
        return NULL;
    }
    if (!cJSON_IsObject(v)) return wrong_type(v, field, "an object", ctx);
    *out = v;
    return NULL;
}
