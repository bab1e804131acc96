//! Calls `dmmul` and `linpack` served by a Python worker (`rtpool worker --serve
//! rtpool.lib.linalg`) from Rust, and prints what came back as JSON lines:
//!
//! ```text
//! RTPOOL_TOKEN=<client token> cargo run -p rtpool-client --example dmmul -- HOST:PORT [N ...]
//! cargo run -p rtpool-client --example dmmul -- HOST:PORT --checks   # bad input, one line each
//! cargo run -p rtpool-client --example dmmul -- HOST:PORT --stdin    # one N a line
//! cargo run -p rtpool-client --example dmmul -- HOST:PORT --bench 1000  # latency, n = 11
//! ```
//!
//! The matrices are made from a formula (`matrix_a`, `matrix_b`, `vector_b`), so a checker
//! (tests/test_rust_client.py) can build the same ones with numpy and compare.

use rtpool_client::{blocking, CallOptions, ClientError, Config, NdArray, Value};

fn matrix_a(n: usize) -> Vec<f64> {
    let mut a = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..n {
            a[i * n + j] =
                ((i * 31 + j * 17) % 97) as f64 / 97.0 + if i == j { n as f64 } else { 0.0 };
        }
    }
    a
}

fn matrix_b(n: usize) -> Vec<f64> {
    (0..n * n)
        .map(|k| ((k / n * 13 + k % n * 7) % 89) as f64 / 89.0)
        .collect()
}

fn vector_b(n: usize) -> Vec<f64> {
    (0..n).map(|i| (i % 10) as f64 / 10.0 + 1.0).collect()
}

fn array(value: &Value) -> Vec<f64> {
    value
        .as_array()
        .and_then(NdArray::to_f64)
        .expect("an array of float64")
}

fn run(client: &blocking::Client, n: usize) -> Result<(), ClientError> {
    let a = NdArray::from_f64(&[n, n], &matrix_a(n))?;
    let b = NdArray::from_f64(&[n, n], &matrix_b(n))?;
    let out = client.call("dmmul", vec![n.into(), a.clone().into(), b.into()])?;
    let c = array(&out[0]);
    let sample: Vec<String> = (0..20)
        .map(|k| format!("{:?}", c[(k * 37 % n) * n + k * 53 % n]))
        .collect();
    println!(
        "{{\"fn\": \"dmmul\", \"n\": {n}, \"sum\": {:?}, \"sample\": [{}]}}",
        c.iter().sum::<f64>(),
        sample.join(", ")
    );
    let rhs = NdArray::from_f64(&[n], &vector_b(n))?;
    let out = client.call("linpack", vec![n.into(), a.into(), rhs.into()])?;
    let x: Vec<String> = array(&out[0]).iter().map(|v| format!("{v:?}")).collect();
    println!(
        "{{\"fn\": \"linpack\", \"n\": {n}, \"x\": [{}]}}",
        x.join(", ")
    );
    Ok(())
}

/// Bad input, one case a line: `case: error message` (or `case: ok`).
fn checks(client: &blocking::Client) {
    let a = NdArray::from_f64(&[2, 2], &[1.0; 4]).unwrap();
    let a3 = NdArray::from_f64(&[2, 3], &[1.0; 6]).unwrap();
    let i32s = NdArray::from_i32(&[2, 2], &[1; 4]).unwrap();
    let big_n = 1200; // two 1200 x 1200 float64: 23 MB, above a master started with --max-frame-mb 20
    let big = NdArray::from_f64(&[big_n, big_n], &vec![0.5; big_n * big_n]).unwrap();
    let cases: Vec<(&str, &str, Vec<Value>)> = vec![
        ("count", "dmmul", vec![2i64.into()]),
        (
            "dtype",
            "dmmul",
            vec![2i64.into(), i32s.clone().into(), i32s.into()],
        ),
        (
            "shape",
            "dmmul",
            vec![2i64.into(), a.clone().into(), a3.into()],
        ),
        (
            "scalar",
            "dmmul",
            vec![2.5f64.into(), a.clone().into(), a.clone().into()],
        ),
        ("unknown", "no_such_function", vec![]),
        (
            "too_large",
            "dmmul",
            vec![big_n.into(), big.clone().into(), big.into()],
        ),
        (
            "after",
            "dmmul",
            vec![2i64.into(), a.clone().into(), a.into()],
        ),
    ];
    for (case, name, args) in cases {
        match client.call_with(name, args, &CallOptions::default()) {
            Ok(out) => println!("{case}: ok {:?}", array(&out[0])),
            Err(e) => println!("{case}: {e}"),
        }
    }
}

/// Latency of `count` sequential dmmul calls at n = 11 (two 968-byte arrays: about 1 KiB per
/// argument, as examples/c/latency.c), after 20 warm-up calls, for `rtpool bench clients`: one
/// JSON line with every call's microseconds and how many products were wrong.
fn bench(client: &blocking::Client, count: usize) {
    let n = 11;
    let (a, b) = (matrix_a(n), matrix_b(n));
    let want: Vec<f64> = (0..n * n)
        .map(|k| (0..n).map(|j| a[k / n * n + j] * b[j * n + k % n]).sum())
        .collect();
    let a = NdArray::from_f64(&[n, n], &a).unwrap();
    let b = NdArray::from_f64(&[n, n], &b).unwrap();
    let args = || vec![Value::from(n), a.clone().into(), b.clone().into()];
    for _ in 0..20 {
        client.call("dmmul", args()).expect("warm-up call");
    }
    let mut wrong = 0;
    let us: Vec<String> = (0..count.max(1))
        .map(|_| {
            let t = std::time::Instant::now();
            let out = client.call("dmmul", args()).expect("call");
            let elapsed = t.elapsed();
            let c = array(&out[0]);
            if c.iter()
                .zip(&want)
                .any(|(x, y)| (x - y).abs() > 1e-9 * y.abs())
            {
                wrong += 1;
            }
            format!("{:.1}", elapsed.as_secs_f64() * 1e6)
        })
        .collect();
    println!(
        "{{\"client\": \"rust\", \"calls\": {}, \"wrong\": {wrong}, \"us\": [{}]}}",
        us.len(),
        us.join(", ")
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(address) = args.next() else {
        eprintln!("usage: dmmul HOST:PORT [N ... | --checks]   (token in RTPOOL_TOKEN)");
        std::process::exit(2);
    };
    let rest: Vec<String> = args.collect();
    let client = match Config::new(&address).and_then(blocking::Client::connect) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    if rest.iter().any(|a| a == "--checks") {
        checks(&client);
        return;
    }
    if let Some(k) = rest.iter().position(|a| a == "--bench") {
        let count = rest.get(k + 1).and_then(|c| c.parse().ok()).unwrap_or(1000);
        bench(&client, count);
        return;
    }
    if rest.iter().any(|a| a == "--stdin") {
        // One N a line, answered as in the default mode, or `error: ...` (the client goes on).
        for line in std::io::stdin().lines() {
            let n = line
                .expect("stdin")
                .trim()
                .parse()
                .expect("N is a positive integer");
            if let Err(e) = run(&client, n) {
                println!("error: {e}");
            }
        }
        return;
    }
    let sizes: Vec<usize> = if rest.is_empty() {
        vec![100, 1000]
    } else {
        rest.iter()
            .map(|s| s.parse().expect("N is a positive integer"))
            .collect()
    };
    for n in sizes {
        if let Err(e) = run(&client, n) {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
