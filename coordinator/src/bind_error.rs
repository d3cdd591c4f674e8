//! What a failed bind says to an operator, for every listener the
//! coordinator opens (REST, its broker, gossip).

/// Says "address in use" plainly for the commonest bind failure.
pub(crate) fn describe_bind_error(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::AddrInUse => "address in use".to_string(),
        std::io::ErrorKind::AddrNotAvailable => "address not available on this host".to_string(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        _ => error.to_string(),
    }
}
