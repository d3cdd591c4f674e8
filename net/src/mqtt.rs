//! The MQTT connection settings agent and coordinator share.

/// Turns Nagle's algorithm off on the connection `eventloop` makes.
///
/// MQTT packets here are small and answered (an assignment, its `running`
/// event, the acknowledgements): with Nagle on, a packet written while an
/// earlier one waits for its ACK is held until the peer's delayed ACK fires,
/// 40 ms on Linux. That wait was most of a task's round trip (BENCHMARKS §1).
pub fn no_delay(eventloop: &mut rumqttc::EventLoop) {
    let mut network = eventloop.network_options();
    network.set_tcp_nodelay(true);
    eventloop.set_network_options(network);
}
