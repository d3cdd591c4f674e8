//! The memory floor the agent is measured against (`scripts/bench-footprint`):
//! a bare program that runs a wasm module through wasmtime and WASI preview 1
//! with the engine settings the agent uses (`starling_wasm::config()`, the
//! same wasmtime features), and nothing else: no MQTT, no journal, no
//! telemetry, no HTTP client, no async runtime of its own.
//!
//! ```text
//! wasm_floor MODULE.wasm INPUT
//! ```
//!
//! It compiles the module once and runs it once with INPUT on its stdin,
//! prints `ready` and the compile time (`ready compile_ms=12.3`) on stdout,
//! then reads lines from its stdin: a line with a
//! number N runs the module N more times one after another (a fresh store and
//! instance each time, as the agent does for each task) and answers `done`;
//! end of input exits. Between the lines it sleeps, so the script samples its
//! `/proc/PID/status` the way it samples the agent's.

use std::io::BufRead;
use std::process::ExitCode;
use std::time::Instant;

use wasmtime::{Engine, Linker, Module, Store};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::{MemoryInputPipe, MemoryOutputPipe};
use wasmtime_wasi::{I32Exit, WasiCtxBuilder};

/// Most bytes of a run's stdout kept (the example task prints one line).
const OUTPUT_CAPACITY: usize = 64 * 1024;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(module_path), Some(input)) = (args.next(), args.next()) else {
        eprintln!("usage: wasm_floor MODULE.wasm INPUT");
        return ExitCode::from(2);
    };
    match serve(&module_path, input.into_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("wasm_floor: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve(module_path: &str, input: Vec<u8>) -> wasmtime::Result<()> {
    let engine = Engine::new(&starling_wasm::config())?;
    let bytes = std::fs::read(module_path)?;
    let compile_started = Instant::now();
    let module = Module::from_binary(&engine, &bytes)?;
    let compile_ms = compile_started.elapsed().as_secs_f64() * 1000.0;
    let mut linker: Linker<WasiP1Ctx> = Linker::new(&engine);
    wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |context| context)?;
    let pre = linker.instantiate_pre(&module)?;

    let run = |input: &[u8]| -> wasmtime::Result<()> {
        let stdout = MemoryOutputPipe::new(OUTPUT_CAPACITY);
        let wasi = WasiCtxBuilder::new()
            .stdin(MemoryInputPipe::new(input.to_vec()))
            .stdout(stdout.clone())
            .build_p1();
        let mut store = Store::new(&engine, wasi);
        // The engine interrupts at epoch deadlines (the agent's wall-time
        // limit); nothing here advances the epoch, so any deadline ahead of
        // zero never arrives.
        store.set_epoch_deadline(1);
        let instance = pre.instantiate(&mut store)?;
        let start = instance.get_typed_func::<(), ()>(&mut store, "_start")?;
        match start.call(&mut store, ()) {
            Ok(()) => {}
            Err(error) => match error.downcast_ref::<I32Exit>() {
                Some(I32Exit(0)) => {}
                _ => return Err(error),
            },
        }
        if stdout.contents().is_empty() {
            wasmtime::bail!("the module printed nothing");
        }
        Ok(())
    };

    run(&input)?;
    println!("ready compile_ms={compile_ms:.1}");
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let runs: u32 = line
            .trim()
            .parse()
            .map_err(|_| wasmtime::format_err!("expected a number of runs, got {line:?}"))?;
        for _ in 0..runs {
            run(&input)?;
        }
        println!("done");
    }
    Ok(())
}
