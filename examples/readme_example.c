/* The README's usage example: RMSNorm over 4 rows of a bf16 activation. */
#include <stdint.h>
#include <stdio.h>
#include "llmkern.h"

int main(void) {
    uint16_t x[4][64], out[4][64]; /* bf16 bits */
    float w[64];
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < 64; i++) x[r][i] = 0x3f80 + (uint16_t)(i % 8); /* ~1.0 .. 1.05 */
    for (int i = 0; i < 64; i++) w[i] = 1.0f;
    lk_tensor tx = lk_tensor_make(x, LK_BF16, 2, (int64_t[]){4, 64});
    lk_tensor tout = lk_tensor_make(out, LK_BF16, 2, (int64_t[]){4, 64});
    lk_tensor tw = lk_tensor_make(w, LK_F32, 1, (int64_t[]){64});
    lk_status s = lk_rms_norm(&tout, &tx, &tw, 1e-6f, /*gemma=*/0);
    if (s != LK_OK) {
        fprintf(stderr, "%s: %s\n", lk_status_str(s), lk_last_error());
        return 1;
    }
    tw.shape[0] = 63; /* wrong on purpose: the error names the argument */
    s = lk_rms_norm(&tout, &tx, &tw, 1e-6f, 0);
    printf("isa=%s threads=%d out[0][0]=0x%04x  bad call: %s (%s)\n", lk_isa_name(lk_isa_current()),
           lk_get_num_threads(), out[0][0], lk_status_str(s), lk_last_error());
    return s == LK_ERR_SHAPE ? 0 : 1;
}
