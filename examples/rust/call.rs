//! Calls one function that workers serve by name and prints its outputs, one a line:
//!
//! ```text
//! RTPOOL_TOKEN=<client token> cargo run -p rtpool-client --example call -- \
//!     HOST:PORT [--ca-file PEM] [--connect-timeout-ms MS] FUNCTION [ARG ...]
//! ```
//!
//! An argument that parses as an integer is an `int`, else as a number a `float`, else a
//! `str`. Outputs print as `int 42`, `float 1.5`, `str text`, or their description. A failure
//! prints `error: MESSAGE` on stderr and exits 1. The fault and TLS tests
//! (tests/test_native_faults.py) call `pid_after` with it.

use std::time::Duration;

use rtpool_client::{blocking, ClientError, Config, Value};

fn parse(arg: &str) -> Value {
    if let Ok(i) = arg.parse::<i64>() {
        Value::from(i)
    } else if let Ok(f) = arg.parse::<f64>() {
        Value::from(f)
    } else {
        Value::from(arg)
    }
}

fn run(mut rest: Vec<String>) -> Result<(), ClientError> {
    let address = rest.remove(0);
    let mut config = Config::new(&address)?;
    while rest.first().is_some_and(|a| a.starts_with("--")) {
        let flag = rest.remove(0);
        let value = if rest.is_empty() {
            String::new()
        } else {
            rest.remove(0)
        };
        config = match flag.as_str() {
            "--ca-file" => config.ca_file(value),
            "--connect-timeout-ms" => {
                let ms = value.parse().map_err(|_| {
                    ClientError::Config(format!("--connect-timeout-ms {value:?}: not a number"))
                })?;
                config.connect_timeout(Duration::from_millis(ms))
            }
            _ => return Err(ClientError::Config(format!("unknown option {flag}"))),
        };
    }
    if rest.is_empty() {
        return Err(ClientError::Config("no FUNCTION given".into()));
    }
    let function = rest.remove(0);
    let client = blocking::Client::connect(config)?;
    let outputs = client.call(&function, rest.iter().map(|a| parse(a)).collect())?;
    for value in &outputs {
        match value {
            Value::Int(i) => println!("int {i}"),
            Value::Float(f) => println!("float {f:?}"),
            Value::Str(s) => println!("str {s}"),
            other => println!("{}", other.describe()),
        }
    }
    client.close();
    Ok(())
}

fn main() {
    let rest: Vec<String> = std::env::args().skip(1).collect();
    if rest.is_empty() {
        eprintln!(
            "usage: call HOST:PORT [--ca-file PEM] [--connect-timeout-ms MS] FUNCTION [ARG ...]"
        );
        std::process::exit(2);
    }
    if let Err(e) = run(rest) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
