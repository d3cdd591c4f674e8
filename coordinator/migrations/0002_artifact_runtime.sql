-- Artifacts are WebAssembly modules or OpenCL packages; the runtime is decided
-- once, when the upload is validated, and read at every submission.
ALTER TABLE artifacts ADD COLUMN runtime TEXT NOT NULL DEFAULT 'wasm';
