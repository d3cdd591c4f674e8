// C = A·B for row-major float matrices A (m×k), B (k×n), C (m×n), in 16×16
// tiles staged through local memory: each work-group loads one tile of A and
// one of B per step, so every global element is read k/16 times instead of k.
// Work-items past the matrix edge load zeros and write nothing, so any m, n, k
// work with the global size rounded up to the tile.
#define TILE 16

__kernel __attribute__((reqd_work_group_size(TILE, TILE, 1)))
void matmul(const uint m, const uint n, const uint k,
            __global const float *a, __global const float *b,
            __global float *c) {
    const uint col = get_global_id(0);
    const uint row = get_global_id(1);
    const uint lc = get_local_id(0);
    const uint lr = get_local_id(1);
    __local float ta[TILE][TILE];
    __local float tb[TILE][TILE];
    float acc = 0.0f;
    for (uint t = 0; t < k; t += TILE) {
        ta[lr][lc] = (row < m && t + lc < k) ? a[row * k + t + lc] : 0.0f;
        tb[lr][lc] = (t + lr < k && col < n) ? b[(t + lr) * n + col] : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint i = 0; i < TILE; ++i) {
            acc += ta[lr][i] * tb[i][lc];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (row < m && col < n) {
        c[row * n + col] = acc;
    }
}
