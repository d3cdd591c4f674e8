//! The OpenCL worker process the agent starts for every probe and kernel run;
//! see [`starling_opencl::worker`].

fn main() -> std::process::ExitCode {
    starling_opencl::worker::main()
}
