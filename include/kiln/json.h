/* Helpers over cJSON for reading config files with precise errors.
 *
 * Every function takes `ctx`, a prefix for error messages (usually the file
 * path, e.g. "model/config.json"; NULL for none), so errors read like
 *   "model/config.json: field 'hidden_size' must be an integer, got string".
 *
 * Getters: look up `field` in the object `obj` (NULL obj counts as empty).
 *  - A missing field, or one whose value is JSON null (HF configs write
 *    "rope_scaling": null), is "missing": if `required` is nonzero that is an
 *    error, otherwise *out gets `dflt` and the call succeeds.
 *  - A present field of the wrong type is always an error.
 * On error *out is left unchanged.
 */
#ifndef KILN_JSON_H
#define KILN_JSON_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "kiln/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Read and parse a JSON file. A syntax error is reported with its position,
 * e.g. "cfg.json: invalid JSON at line 3, column 8 (near ']')".
 * On success the caller frees *out with cJSON_Delete. */
kiln_error *kiln_json_parse_file(const char *path, cJSON **out);
/* Parse len bytes of text (need not be NUL-terminated); errors start with ctx. */
kiln_error *kiln_json_parse(const char *text, size_t len, const char *ctx, cJSON **out);

/* cJSON_Print (formatted) or cJSON_PrintUnformatted, but every number exact: the shortest text that reads back as
 * the same double. cJSON 1.7.15 prints 15 significant digits when they read back "close enough" (0.1 + 0.2 as 0.3,
 * 6434445538011819 as 6.43444553801182e+15): a config or manifest written through it would not read back the same.
 * Non-finite numbers print as null (as cJSON does). malloc'd; NULL when out of memory. */
char *kiln_json_print(const cJSON *item, int formatted);
/* 1 and *out set when item is a whole number within +-2^53 (so it is exact in a double), else 0 (*out untouched):
 * the one place a JSON number becomes an integer (a double beyond int64 converted is undefined behaviour). */
int kiln_json_int_value(const cJSON *item, int64_t *out);
/* A whole number within +-2^53 (kiln_json_int_value): 4096, 1e3, -2.
 * Rejects 1.5, "32", true. */
kiln_error *kiln_json_get_int(const cJSON *obj, const char *field, int64_t *out, int64_t dflt, int required,
                              const char *ctx);
/* Any JSON number. */
kiln_error *kiln_json_get_double(const cJSON *obj, const char *field, double *out, double dflt, int required,
                                 const char *ctx);
/* true or false (not 0/1). *out is 1 or 0. */
kiln_error *kiln_json_get_bool(const cJSON *obj, const char *field, int *out, int dflt, int required,
                               const char *ctx);
/* A string; *out points into the cJSON tree (valid until cJSON_Delete). */
kiln_error *kiln_json_get_string(const cJSON *obj, const char *field, const char **out, const char *dflt,
                                 int required, const char *ctx);
/* An array or object node (for lists and nested sections); *out is the node
 * itself, or NULL when missing and not required. */
kiln_error *kiln_json_get_array(const cJSON *obj, const char *field, const cJSON **out, int required,
                                const char *ctx);
kiln_error *kiln_json_get_object(const cJSON *obj, const char *field, const cJSON **out, int required,
                                 const char *ctx);

/* "string", "number", "boolean", "null", "array", "object" (for messages). */
const char *kiln_json_type_name(const cJSON *item);
/* A JSON value as a message should show it: numbers in their shortest
 * round-tripping form (-3, 1.5, 1e+300), short strings quoted ("F32"),
 * anything else by its type name. Writes at most cap bytes to buf; returns buf. */
const char *kiln_json_describe(const cJSON *item, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
