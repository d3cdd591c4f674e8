//! Fuzzes the `SignedReport` envelope decoder (see src/lib.rs for what is checked).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    starling_proto_fuzz::round_trip::<starling_proto::SignedReport>(data);
});
