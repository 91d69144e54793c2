/* Calls the kernels of kernels.h and checks them against naive C loops; exit 0 if all match. The conv2d
   kernel is prepacked=1: its weights are laid out once at start-up by its pack function, as a firmware
   with constant weights does, then every frame calls the kernel alone. */
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

/* out[k][y][x] = sum over c, i, j of in[c][y + i - 1][x + j - 1] * w[k][c][i][j] (zero outside the
   image): NCHW input, OIHW weights, 3x3, stride 1, pad 1, one image. Returns the number of mismatches. */
static int check_conv(int c, int h, int w, int k, const float *in, const float *wt,
                      const float *out) {
    int bad = 0;
    for (int o = 0; o < k; o++) {
        for (int y = 0; y < h; y++) {
            for (int x = 0; x < w; x++) {
                float want = 0.0f;
                for (int ch = 0; ch < c; ch++) {
                    for (int i = 0; i < 3; i++) {
                        for (int j = 0; j < 3; j++) {
                            int yy = y + i - 1, xx = x + j - 1;
                            if (yy < 0 || yy >= h || xx < 0 || xx >= w) continue;
                            want += in[(ch * h + yy) * w + xx] * wt[((o * c + ch) * 3 + i) * 3 + j];
                        }
                    }
                }
                float diff = out[(o * h + y) * w + x] - want;
                if (!(diff <= 1e-3f && diff >= -1e-3f)) bad++;
            }
        }
    }
    return bad;
}

/* Buffers are static: a firmware build would place them in its own RAM sections. The kernels need
   only the stack given by *_STACK_BYTES (plus about 1 KiB for their frames). */
static float dense_in[1 * 64], dense_w[64 * 32], dense_out[1 * 32];
static float tile_a[16 * 16], tile_b[16 * 16], tile_c[16 * 16];
/* The conv2d's weights as the workload lays them out (OIHW), and as its kernel reads them. */
static float conv_w[32 * 16 * 3 * 3], conv_packed[XT_CONV2D_N1_C16_H14_W14_K32_R3_S3_STRIDE1_PAD1_PREPACKED1_PACKED_FLOATS];
static float conv_in[16 * 14 * 14], conv_out[32 * 14 * 14];

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

    /* Start-up: the constant weights are packed once (in a firmware, from flash into RAM). */
    fill(conv_w, 32 * 16 * 3 * 3);
    xt_conv2d_n1_c16_h14_w14_k32_r3_s3_stride1_pad1_prepacked1_pack(conv_w, conv_packed);
    /* The main loop: a new frame each time, the kernel reads the packed weights as they are. */
    int frame_bad = 0;
    for (int frame = 0; frame < 3; frame++) {
        fill(conv_in, 16 * 14 * 14);
        xt_conv2d_n1_c16_h14_w14_k32_r3_s3_stride1_pad1_prepacked1(conv_in, conv_packed, conv_out);
        frame_bad += check_conv(16, 14, 14, 32, conv_in, conv_w, conv_out) != 0;
    }
    printf("%-26s %s\n", "xt_conv2d_..._prepacked1", frame_bad ? "MISMATCH" : "ok");
    bad += frame_bad;

    printf("stack for panels: %u + %u + %u bytes\n", (unsigned)XT_MATMUL_M1_N32_K64_STACK_BYTES,
           (unsigned)XT_MATMUL_M16_N16_K16_STACK_BYTES,
           (unsigned)XT_CONV2D_N1_C16_H14_W14_K32_R3_S3_STRIDE1_PAD1_PREPACKED1_STACK_BYTES);
    return bad ? 1 : 0;
}
