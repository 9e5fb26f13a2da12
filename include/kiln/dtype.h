/* Element types shared by the file formats and the tensor layer. */
#ifndef KILN_DTYPE_H
#define KILN_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KILN_DT_INVALID = 0,
    KILN_DT_F64, KILN_DT_F32, KILN_DT_F16, KILN_DT_BF16,
    KILN_DT_F8_E4M3, KILN_DT_F8_E5M2,
    KILN_DT_I64, KILN_DT_I32, KILN_DT_I16, KILN_DT_I8,
    KILN_DT_U64, KILN_DT_U32, KILN_DT_U16, KILN_DT_U8,
    KILN_DT_BOOL
} kiln_dtype;

/* "F32" -> KILN_DT_F32; KILN_DT_INVALID for unknown names. */
kiln_dtype kiln_dtype_from_name(const char *name);
const char *kiln_dtype_name(kiln_dtype dt);
size_t kiln_dtype_size(kiln_dtype dt);

float kiln_bf16_to_f32(uint16_t h);
uint16_t kiln_f32_to_bf16(float f); /* round to nearest even, NaN preserved */
float kiln_f16_to_f32(uint16_t h);
uint16_t kiln_f32_to_f16(float f);

#ifdef __cplusplus
}
#endif
#endif
