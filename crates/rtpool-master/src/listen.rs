//! The master's listening socket, bound with a listen backlog sized for its connection limit.
//!
//! `tokio::net::TcpListener::bind` asks the kernel for a backlog of 128 (the standard
//! library's value, which mio copies). When thousands of
//! workers connect at once (a master restart, a cluster starting), the accept queue fills
//! faster than the accept loop drains it even though each refusal is answered at once; the
//! kernel then drops the handshakes past the queue (`ListenOverflows` in `nstat`) and their
//! peers wait for a SYN retransmission, 1 s and then 3 s later. [`listen_backlog`] asks for
//! as many as the master may serve; the kernel caps it at `net.core.somaxconn` (4,096 by
//! default since Linux 5.4), so raising that sysctl is the operator's knob beyond it.

use std::io;

use tokio::net::{TcpListener, TcpSocket};

/// The smallest backlog asked for, whatever the connection limit.
pub const MIN_BACKLOG: u32 = 1024;

/// The backlog to ask for with a connection limit of `max_connections`: the limit itself,
/// within [`MIN_BACKLOG`]..=65,535 (the kernel caps it at `net.core.somaxconn`).
pub fn listen_backlog(max_connections: usize) -> u32 {
    u32::try_from(max_connections)
        .unwrap_or(u32::MAX)
        .clamp(MIN_BACKLOG, 65_535)
}

/// Bind `listen` (`host:port`, the first address it resolves to) with `SO_REUSEADDR` (as
/// tokio's own `bind`) and listen with a backlog of `backlog`.
///
/// # Errors
///
/// The address does not resolve, or the socket cannot be created, bound or put to listen.
pub async fn bind(listen: &str, backlog: u32) -> io::Result<TcpListener> {
    let mut last = None;
    for addr in tokio::net::lookup_host(listen).await? {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(addr).and_then(|()| socket.listen(backlog)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the address resolved to nothing",
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backlog_follows_the_connection_limit_within_bounds() {
        assert_eq!(listen_backlog(16), 1024);
        assert_eq!(listen_backlog(17_388), 17_388);
        assert_eq!(listen_backlog(1 << 20), 65_535);
    }

    #[tokio::test]
    async fn binds_an_ephemeral_port_and_accepts() {
        let listener = bind("127.0.0.1:0", 4096).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        listener.accept().await.unwrap();
    }

    #[tokio::test]
    async fn a_bad_address_is_an_error() {
        assert!(bind("127.0.0.1:notaport", 1024).await.is_err());
    }
}
