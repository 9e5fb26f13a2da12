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
/* f as (hi, lo): hi f rounded to bf16 to nearest, ties toward zero; lo f's low 16 bits. kiln_f32_join(hi, lo) is f
 * bit for bit (a NaN: a NaN). The CUDA trainer keeps the experts' f32 master weights so (kiln_f32_split_cuda): hi is
 * the bf16 copy its GEMMs read, so an update moves 4 bytes of weight instead of 6. */
void kiln_f32_split(float f, uint16_t *hi, uint16_t *lo);
float kiln_f32_join(uint16_t hi, uint16_t lo);
float kiln_f16_to_f32(uint16_t h);
uint16_t kiln_f32_to_f16(float f);

#ifdef __cplusplus
}
#endif
#endif
