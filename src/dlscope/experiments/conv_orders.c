/* The seed's seven-loop direct convolution (NCHW, float32), compiled, in two loop orders.

   Python's interpreter costs ~100 ns per multiply-add and hides every cache effect, so the
   loop-order experiment runs here: identical arithmetic, only the nesting order differs.

   usage: conv_orders ORDER N C H W K R S STRIDE PAD REPEATS OUT.bin
     ORDER  seed     n, k, c, oh, ow, r, s   (innermost loops walk an input row: unit stride)
            strided  n, c, r, s, ow, oh, k   (innermost loop jumps a whole output plane per k)
   Inputs are generated from their index (see input_value) so the caller can rebuild them;
   the output of the last repeat is written to OUT.bin; the median seconds go to stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static float input_value(long i) { return (float)((i * 7919) % 1000) / 1000.0f - 0.5f; }
static float weight_value(long i) { return (float)((i * 104729) % 1000) / 1000.0f - 0.5f; }

#define X(n, c, h, w) x[(((long)(n) * C + (c)) * Hp + (h)) * Wp + (w)]
#define WT(k, c, r, s) wt[(((long)(k) * C + (c)) * R + (r)) * S + (s)]
#define Y(n, k, h, w) y[(((long)(n) * K + (k)) * OH + (h)) * OW + (w)]

static void conv_seed(const float *x, const float *wt, float *y, int N, int C, int Hp, int Wp, int K, int R,
                      int S, int OH, int OW, int stride) {
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            for (int c = 0; c < C; c++)
                for (int oh = 0; oh < OH; oh++)
                    for (int ow = 0; ow < OW; ow++)
                        for (int r = 0; r < R; r++)
                            for (int s = 0; s < S; s++)
                                Y(n, k, oh, ow) += X(n, c, oh * stride + r, ow * stride + s) * WT(k, c, r, s);
}

static void conv_strided(const float *x, const float *wt, float *y, int N, int C, int Hp, int Wp, int K, int R,
                         int S, int OH, int OW, int stride) {
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int r = 0; r < R; r++)
                for (int s = 0; s < S; s++)
                    for (int ow = 0; ow < OW; ow++)
                        for (int oh = 0; oh < OH; oh++)
                            for (int k = 0; k < K; k++)
                                Y(n, k, oh, ow) += X(n, c, oh * stride + r, ow * stride + s) * WT(k, c, r, s);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
    double d = *(const double *)a - *(const double *)b;
    return (d > 0) - (d < 0);
}

int main(int argc, char **argv) {
    if (argc != 13) {
        fprintf(stderr, "usage: %s seed|strided N C H W K R S STRIDE PAD REPEATS OUT.bin\n", argv[0]);
        return 2;
    }
    int strided = strcmp(argv[1], "strided") == 0;
    int N = atoi(argv[2]), C = atoi(argv[3]), H = atoi(argv[4]), W = atoi(argv[5]);
    int K = atoi(argv[6]), R = atoi(argv[7]), S = atoi(argv[8]), stride = atoi(argv[9]), pad = atoi(argv[10]);
    int repeats = atoi(argv[11]);
    int Hp = H + 2 * pad, Wp = W + 2 * pad;
    int OH = (Hp - R) / stride + 1, OW = (Wp - S) / stride + 1;
    long nx = (long)N * C * Hp * Wp, nw = (long)K * C * R * S, ny = (long)N * K * OH * OW;
    float *x = calloc(nx, sizeof(float)), *wt = malloc(nw * sizeof(float)), *y = malloc(ny * sizeof(float));
    double *seconds = malloc(repeats * sizeof(double));
    if (!x || !wt || !y || !seconds) return 1;
    long i = 0; /* the unpadded input, in NCHW order, copied into the zero-padded buffer */
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int h = 0; h < H; h++)
                for (int w = 0; w < W; w++) X(n, c, h + pad, w + pad) = input_value(i++);
    for (i = 0; i < nw; i++) wt[i] = weight_value(i);
    for (int rep = 0; rep < repeats; rep++) {
        memset(y, 0, ny * sizeof(float));
        double start = now();
        (strided ? conv_strided : conv_seed)(x, wt, y, N, C, Hp, Wp, K, R, S, OH, OW, stride);
        seconds[rep] = now() - start;
    }
    qsort(seconds, repeats, sizeof(double), by_value);
    FILE *out = fopen(argv[12], "wb");
    if (!out || fwrite(y, sizeof(float), ny, out) != (size_t)ny || fclose(out) != 0) return 1;
    printf("%.9f\n", seconds[repeats / 2]);
    return 0;
}
