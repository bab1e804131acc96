//! Shared by the master's scenario tests: a raw protocol peer and an in-process master.

#![allow(dead_code)] // each test crate uses a different part of this module

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::BytesMut;
use rtpool_master::{MasterConfig, MasterHandle};
use rtpool_proto::{decode_frame, encode_to_vec, Msg, Role};

/// A raw protocol peer over loopback TCP.
pub struct Peer {
    /// The socket, for writes of hand-made bytes.
    pub sock: TcpStream,
    buf: BytesMut,
}

impl Peer {
    /// Connects without a handshake.
    pub fn connect(master: &MasterHandle) -> Self {
        let sock = TcpStream::connect(master.addr()).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        sock.set_nodelay(true).unwrap();
        Self {
            sock,
            buf: BytesMut::new(),
        }
    }

    /// Connects and sends `HELLO`; returns the peer and the master's answer.
    pub fn hello(master: &MasterHandle, role: Role, token: &str, slots: u32) -> (Self, Msg) {
        let mut p = Self::connect(master);
        let name = "test".to_string();
        p.send(&Msg::Hello {
            features: 0,
            labels: Default::default(),
            resources: Default::default(),
            version: rtpool_proto::PROTOCOL_VERSION,
            role,
            token: token.into(),
            name,
            slots,
            identity: None,
        });
        let reply = p.recv();
        (p, reply)
    }

    /// Sends one message.
    pub fn send(&mut self, msg: &Msg) {
        self.sock.write_all(&encode_to_vec(msg)).unwrap();
    }

    /// Next message, or panic after the read timeout.
    pub fn recv(&mut self) -> Msg {
        loop {
            if let Some(m) = decode_frame(&mut self.buf, 1 << 30).unwrap() {
                return m;
            }
            let mut chunk = [0u8; 65536];
            let n = self.sock.read(&mut chunk).expect("read timed out");
            assert!(n > 0, "connection closed while a message was expected");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The next whole frame as it came (length prefix included), undecoded.
    pub fn recv_frame(&mut self) -> Vec<u8> {
        loop {
            if self.buf.len() >= 4 {
                let len = u32::from_be_bytes(self.buf[..4].try_into().unwrap()) as usize;
                if self.buf.len() >= 4 + len {
                    return self.buf.split_to(4 + len).to_vec();
                }
            }
            let mut chunk = [0u8; 65536];
            let n = self.sock.read(&mut chunk).expect("read timed out");
            assert!(n > 0, "connection closed while a frame was expected");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// True when the master closed the connection (after any pending messages).
    pub fn is_closed(&mut self) -> bool {
        let mut chunk = [0u8; 1024];
        matches!(self.sock.read(&mut chunk), Ok(0) | Err(_))
    }
}

/// A master on an ephemeral loopback port, nothing on disk.
pub fn master() -> MasterHandle {
    MasterHandle::start(MasterConfig {
        listen: "127.0.0.1:0".into(),
        ..Default::default()
    })
    .unwrap()
}

/// The package of an `ACCEPTED` answering `req_id`.
pub fn expect_accepted(msg: Msg, req_id: u64) -> u64 {
    match msg {
        Msg::Accepted {
            req_id: r, package, ..
        } if r == req_id => package,
        other => panic!("expected ACCEPTED {req_id}, got {other:?}"),
    }
}

/// The message of an `ERROR` of `code`.
pub fn expect_error(msg: Msg, code: &str) -> String {
    match msg {
        Msg::Error {
            code: c, message, ..
        } if c == code => message,
        other => panic!("expected ERROR {code}, got {other:?}"),
    }
}

/// Polls `pred` until it holds, or panics naming `what` after 5 s.
pub fn wait_until(what: &str, mut pred: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !pred() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
