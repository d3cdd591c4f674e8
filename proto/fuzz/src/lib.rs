//! What every fuzz target checks: a decoder may refuse input, never panic;
//! whatever it accepts must encode again, and that encoding must be stable.
//! Bytes are compared, not messages: `Message` does not require `PartialEq`.
//! Every message's check refuses NaN and infinities, so an accepted message
//! always encodes again (`encode` runs the same check).

use starling_proto::{decode, encode, Message};

/// Decodes `data` as `M`; if accepted, checks the encode/decode round trip.
pub fn round_trip<M: Message>(data: &[u8]) {
    if let Ok(message) = decode::<M>(data) {
        let bytes = encode(&message).expect("an accepted message encodes");
        let again = decode::<M>(&bytes).expect("an encoded message decodes");
        assert_eq!(encode(&again).expect("and encodes again"), bytes);
    }
}
