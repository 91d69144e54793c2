/* Runs a whole network built by `xtune build --model` on the input of a reference file written by
 * `xtune build --model ... --reference net.ref`, and compares the output with ONNX Runtime's in that file.
 * Usage: demo net.ref   (exit 0 when the output matches, 1 otherwise, 2 on a bad reference file).
 *
 * The reference file (little-endian): "XTNETREF", u32 version 1, u32 build id, u64 input floats,
 * u64 output floats, then the input and the expected output as float32 (docs/firmware.md). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net.h"

/* The workspace the header asks for, 64-byte aligned; static here, any caller-owned memory will do. */
static _Alignas(64) unsigned char workspace[NET_WORKSPACE_BYTES > 0 ? NET_WORKSPACE_BYTES : 1];
static float input[NET_INPUT_SIZE], output[NET_OUTPUT_SIZE], expected[NET_OUTPUT_SIZE];

static int read_reference(const char *path) {
    unsigned char head[32];
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return 0; }
    int ok = fread(head, 1, sizeof head, f) == sizeof head && memcmp(head, "XTNETREF", 8) == 0;
    uint32_t version, build_id;
    uint64_t n_in, n_out;
    memcpy(&version, head + 8, 4);
    memcpy(&build_id, head + 12, 4);
    memcpy(&n_in, head + 16, 8);
    memcpy(&n_out, head + 24, 8);
    ok = ok && version == 1 && n_in == NET_INPUT_SIZE && n_out == NET_OUTPUT_SIZE;
    if (ok && build_id != NET_BUILD_ID) {
        fprintf(stderr, "%s: written for build %08x, the header is build %08x\n", path, (unsigned)build_id,
                (unsigned)NET_BUILD_ID);
        ok = 0;
    }
    ok = ok && fread(input, sizeof(float), NET_INPUT_SIZE, f) == NET_INPUT_SIZE;
    ok = ok && fread(expected, sizeof(float), NET_OUTPUT_SIZE, f) == NET_OUTPUT_SIZE;
    fclose(f);
    if (!ok) fprintf(stderr, "%s: not a reference file of this network\n", path);
    return ok;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s REFERENCE\n", argv[0]); return 2; }
    /* The object and the header must be of one build. */
    if (net_build_id() != NET_BUILD_ID || net_workspace_bytes() != NET_WORKSPACE_BYTES) {
        fprintf(stderr, "the object is not the build net.h describes\n");
        return 2;
    }
    if (!read_reference(argv[1])) return 2;
    for (size_t i = 0; i < NET_OUTPUT_SIZE; i++) output[i] = NAN; /* unwritten elements show */
    net_run(input, output, workspace);
    /* xtune's rule: max |got - ref| <= 1e-4 * max(1, max |ref|) (xtune/firmware/bench.py). */
    float scale = 1.0f, worst = 0.0f;
    size_t at = 0;
    for (size_t i = 0; i < NET_OUTPUT_SIZE; i++) scale = fmaxf(scale, fabsf(expected[i]));
    for (size_t i = 0; i < NET_OUTPUT_SIZE; i++) {
        float err = fabsf(output[i] - expected[i]);
        if (!(err <= worst)) { worst = err; at = i; } /* a NaN is the worst */
    }
    int ok = worst <= 1e-4f * scale;
    size_t best = 0;
    for (size_t i = 1; i < NET_OUTPUT_SIZE; i++) if (output[i] > output[best]) best = i;
    printf("%s: max abs error %g at %zu (tolerance %g); top class %zu\n", ok ? "match" : "MISMATCH",
           (double)worst, at, 1e-4 * scale, best);
    return ok ? 0 : 1;
}
