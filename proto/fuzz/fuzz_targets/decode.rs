//! Feeds arbitrary bytes to every decoder of the wire protocol. A decoder may
//! refuse input, never panic; whatever it accepts must encode again, and that
//! encoding must be stable (bytes are compared, not messages, since NaN ≠ NaN).
#![no_main]

use libfuzzer_sys::fuzz_target;
use starling_proto::{
    decode, encode, Assignment, Cancel, Capability, EventAck, Message, Status, TaskEvent,
    Telemetry,
};

fn round_trip<M: Message>(data: &[u8]) {
    if let Ok(message) = decode::<M>(data) {
        let bytes = encode(&message).expect("an accepted message encodes");
        let again = decode::<M>(&bytes).expect("an encoded message decodes");
        assert_eq!(encode(&again).expect("and encodes again"), bytes);
    }
}

fuzz_target!(|data: &[u8]| {
    round_trip::<Capability>(data);
    round_trip::<Telemetry>(data);
    round_trip::<Status>(data);
    round_trip::<Assignment>(data);
    round_trip::<Cancel>(data);
    round_trip::<TaskEvent>(data);
    round_trip::<EventAck>(data);
});
