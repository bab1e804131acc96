//! Message kinds as they appear as the first array element on the wire, and their names.
//! A leaf module: errors name kinds without knowing the messages.
#![allow(missing_docs)]

pub const HELLO: u8 = 1;
pub const WELCOME: u8 = 2;
pub const ERROR: u8 = 3;
pub const SUBMIT: u8 = 10;
pub const ACCEPTED: u8 = 11;
pub const RESULTS: u8 = 12;
pub const CANCEL: u8 = 13;
pub const STATUS: u8 = 14;
pub const STATUS_REPLY: u8 = 15;
pub const ATTACH: u8 = 16;
pub const ACK: u8 = 17;
pub const CALL: u8 = 18;
pub const FUNCTIONS: u8 = 19;
pub const PULL: u8 = 20;
pub const ASSIGN: u8 = 21;
pub const RESULT: u8 = 22;
pub const RETURN: u8 = 23;
pub const HEARTBEAT: u8 = 24;
pub const DRAIN: u8 = 25;
pub const ABORT: u8 = 26;
pub const SERVE: u8 = 27;
pub const ASSIGN_CALLS: u8 = 28;
pub const FUNCTIONS_REPLY: u8 = 29;
pub const CLUSTER_STATUS: u8 = 30;
pub const CLUSTER_STATUS_REPLY: u8 = 31;
pub const RELEASE: u8 = 32;
pub const DROP: u8 = 33;

/// The upper-case name of a message kind (`"HELLO"`), or `None` if no such kind exists.
pub fn name(kind: u8) -> Option<&'static str> {
    Some(match kind {
        HELLO => "HELLO",
        WELCOME => "WELCOME",
        ERROR => "ERROR",
        SUBMIT => "SUBMIT",
        ACCEPTED => "ACCEPTED",
        RESULTS => "RESULTS",
        CANCEL => "CANCEL",
        STATUS => "STATUS",
        STATUS_REPLY => "STATUS_REPLY",
        ATTACH => "ATTACH",
        ACK => "ACK",
        CALL => "CALL",
        FUNCTIONS => "FUNCTIONS",
        PULL => "PULL",
        ASSIGN => "ASSIGN",
        RESULT => "RESULT",
        RETURN => "RETURN",
        HEARTBEAT => "HEARTBEAT",
        DRAIN => "DRAIN",
        ABORT => "ABORT",
        SERVE => "SERVE",
        ASSIGN_CALLS => "ASSIGN_CALLS",
        FUNCTIONS_REPLY => "FUNCTIONS_REPLY",
        CLUSTER_STATUS => "CLUSTER_STATUS",
        CLUSTER_STATUS_REPLY => "CLUSTER_STATUS_REPLY",
        RELEASE => "RELEASE",
        DROP => "DROP",
        _ => return None,
    })
}
