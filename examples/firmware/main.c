/* Calls the two kernels of kernels.h and checks them against a naive C matmul; exit 0 if all match. */
#include <stdio.h>

#include "kernels.h"

/* Deterministic inputs in [-1, 1) without libm or rand(): a 32-bit LCG (Numerical Recipes). */
static unsigned int seed = 12345u;
static float next_input(void) {
    seed = seed * 1664525u + 1013904223u;
    return (float)(seed >> 8) / 8388608.0f - 1.0f;
}

static void fill(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = next_input();
}

/* C[m][n] = A[m][k] @ B[k][n], row-major, as the header documents; returns the number of mismatches. */
static int check(const char *name, int m, int n, int k, const float *A, const float *B, const float *C) {
    int bad = 0;
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            float want = 0.0f;
            for (int p = 0; p < k; p++) want += A[i * k + p] * B[p * n + j];
            float diff = C[i * n + j] - want;
            if (!(diff <= 1e-3f && diff >= -1e-3f)) bad++; /* also catches NaN */
        }
    }
    printf("%-26s %s\n", name, bad ? "MISMATCH" : "ok");
    return bad;
}

/* Buffers are static: a firmware build would place them in its own RAM sections. The kernels need
   only the stack given by *_STACK_BYTES (plus about 1 KiB for their frames). */
static float dense_in[1 * 64], dense_w[64 * 32], dense_out[1 * 32];
static float tile_a[16 * 16], tile_b[16 * 16], tile_c[16 * 16];

int main(void) {
    int bad = 0;
    fill(dense_in, 1 * 64);
    fill(dense_w, 64 * 32);
    xt_matmul_m1_n32_k64(dense_in, dense_w, dense_out);
    bad += check("xt_matmul_m1_n32_k64", 1, 32, 64, dense_in, dense_w, dense_out);

    fill(tile_a, 16 * 16);
    fill(tile_b, 16 * 16);
    xt_matmul_m16_n16_k16(tile_a, tile_b, tile_c);
    bad += check("xt_matmul_m16_n16_k16", 16, 16, 16, tile_a, tile_b, tile_c);

    printf("stack for panels: %u + %u bytes\n", (unsigned)XT_MATMUL_M1_N32_K64_STACK_BYTES,
           (unsigned)XT_MATMUL_M16_N16_K16_STACK_BYTES);
    return bad ? 1 : 0;
}
