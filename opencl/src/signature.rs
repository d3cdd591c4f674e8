//! Reads a kernel's parameter list from OpenCL C source, to check a spec
//! against it without an OpenCL compiler (the coordinator has none).
