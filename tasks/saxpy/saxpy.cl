// y = a·x + y over n floats: the smallest useful kernel, and the one every
// OpenCL stack gets right, so a failure here points at Starling, not at the
// kernel.
__kernel void saxpy(const uint n, const float a,
                    __global const float *x, __global float *y) {
    const uint i = get_global_id(0);
    if (i < n) {
        y[i] = a * x[i] + y[i];
    }
}
