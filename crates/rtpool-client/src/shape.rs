//! Shape expressions of array parameters (`"n, n"`, `"m, n + 1"`, `"2 * n"`, `"*"`), as
//! `docs/rpc.md` defines them: integer literals, names of scalar int parameters, `+ - * //`
//! and parentheses; `*` is any size. Evaluated by a small recursive-descent parser, the same
//! whitelist as the Python client's `rpc/shape.py`.

use std::collections::HashMap;

/// One dimension's expected size: `None` for `*` or a name this call gives no value.
pub(crate) fn eval_shape(
    shape: &str,
    scalars: &HashMap<&str, i64>,
) -> Result<Vec<Option<i64>>, String> {
    let mut dims: Vec<&str> = shape.split(',').map(str::trim).collect();
    if dims.len() > 1 && dims.last() == Some(&"") {
        dims.pop(); // "n," is 1-d
    }
    if dims == [""] {
        return Ok(Vec::new());
    }
    dims.into_iter()
        .map(|d| {
            if d == "*" {
                return Ok(None);
            }
            let mut p = Parser {
                s: d.as_bytes(),
                pos: 0,
                scalars,
            };
            let v = p.expr()?;
            p.skip_ws();
            if p.pos != p.s.len() {
                return Err(format!("cannot read dimension {d:?}"));
            }
            Ok(v)
        })
        .collect()
}

struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
    scalars: &'a HashMap<&'a str, i64>,
}

type Dim = Result<Option<i64>, String>;

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while self.s.get(self.pos).is_some_and(u8::is_ascii_whitespace) {
            self.pos += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.pos).copied()
    }

    fn expr(&mut self) -> Dim {
        let mut left = self.term()?;
        while let Some(op @ (b'+' | b'-')) = self.peek() {
            self.pos += 1;
            let right = self.term()?;
            left = left
                .zip(right)
                .map(|(a, b)| if op == b'+' { a + b } else { a - b });
        }
        Ok(left)
    }

    fn term(&mut self) -> Dim {
        let mut left = self.atom()?;
        loop {
            match self.peek() {
                Some(b'*') => {
                    self.pos += 1;
                    let right = self.atom()?;
                    left = left.zip(right).map(|(a, b)| a * b);
                }
                Some(b'/') if self.s.get(self.pos + 1) == Some(&b'/') => {
                    self.pos += 2;
                    let right = self.atom()?;
                    left = match left.zip(right) {
                        Some((_, 0)) => return Err("division by zero in a shape".into()),
                        Some((a, b)) => Some(a.div_euclid(b)),
                        None => None,
                    };
                }
                _ => return Ok(left),
            }
        }
    }

    fn atom(&mut self) -> Dim {
        match self.peek() {
            Some(b'(') => {
                self.pos += 1;
                let v = self.expr()?;
                if self.peek() != Some(b')') {
                    return Err("missing )".into());
                }
                self.pos += 1;
                Ok(v)
            }
            Some(c) if c.is_ascii_digit() => {
                let start = self.pos;
                while self.s.get(self.pos).is_some_and(u8::is_ascii_digit) {
                    self.pos += 1;
                }
                let text = std::str::from_utf8(&self.s[start..self.pos]).expect("digits");
                text.parse()
                    .map(Some)
                    .map_err(|_| format!("{text} is too large"))
            }
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => {
                let start = self.pos;
                while self
                    .s
                    .get(self.pos)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
                {
                    self.pos += 1;
                }
                let name = std::str::from_utf8(&self.s[start..self.pos]).expect("ascii");
                Ok(self.scalars.get(name).copied())
            }
            _ => Err("a dimension is an integer, a parameter name, + - * // or ( )".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_evaluate_over_the_scalars() {
        let scalars = HashMap::from([("n", 4), ("m", 3)]);
        let dims = eval_shape("n, m + 1, 2 * (n - 1), n // 3, *", &scalars).unwrap();
        assert_eq!(dims, vec![Some(4), Some(4), Some(6), Some(1), None]);
        assert_eq!(eval_shape("n,", &scalars).unwrap(), vec![Some(4)]);
        assert_eq!(eval_shape("k", &scalars).unwrap(), vec![None]);
        assert!(eval_shape("n ** 2", &scalars).is_err());
        assert!(eval_shape("n // 0", &scalars).is_err());
    }
}
