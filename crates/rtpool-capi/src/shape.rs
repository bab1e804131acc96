//! Shape expressions of array parameters (`"n, n"`, `"m, n + 1"`, `"2 * n"`, `"*"`), as
//! `docs/rpc.md` defines them: integer literals, names of scalar `int` parameters, `+ - * //`
//! and parentheses; `*` is any size. A C caller passes a bare data pointer for an array whose
//! shape is fully determined, so this module turns the expression and the call's integer
//! arguments into the dimensions (the worker checks them again).

use std::collections::HashMap;

/// One dimension of a shape.
#[derive(Debug, Clone, PartialEq)]
pub enum Dim {
    /// `*`: any size (the caller must give the shape, `rtpool_array_t`).
    Any,
    /// An expression over integer parameters.
    Expr(Expr),
}

/// A dimension expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// An integer literal.
    Lit(i64),
    /// A scalar `int` parameter, by name.
    Name(String),
    /// `left op right`, `op` one of `+ - * /` (`/` is Python's `//`, floor division).
    Bin(Box<Expr>, char, Box<Expr>),
}

/// Parse a shape string; `""` is a 0-d array.
///
/// # Errors
///
/// A message naming the dimension that is not an expression of the allowed form.
pub fn parse(shape: &str) -> Result<Vec<Dim>, String> {
    let shape = shape.trim();
    if shape.is_empty() {
        return Ok(Vec::new());
    }
    let mut dims: Vec<&str> = shape.split(',').map(str::trim).collect();
    if dims.len() > 1 && dims.last() == Some(&"") {
        dims.pop();
    }
    dims.into_iter()
        .map(|dim| {
            if dim == "*" {
                return Ok(Dim::Any);
            }
            let tokens = tokenize(dim).map_err(|e| format!("dimension {dim:?}: {e}"))?;
            let mut parser = Parser { tokens, at: 0 };
            let expr = parser
                .sum()
                .map_err(|e| format!("dimension {dim:?}: {e}"))?;
            if parser.at != parser.tokens.len() {
                return Err(format!(
                    "dimension {dim:?}: unexpected {:?}",
                    parser.tokens[parser.at]
                ));
            }
            Ok(Dim::Expr(expr))
        })
        .collect()
}

/// The value of `expr` given the call's integer arguments by name.
///
/// # Errors
///
/// A message when a name is not an integer argument, or on overflow or division by zero.
pub fn eval(expr: &Expr, ints: &HashMap<String, i64>) -> Result<i64, String> {
    match expr {
        Expr::Lit(v) => Ok(*v),
        Expr::Name(name) => ints
            .get(name)
            .copied()
            .ok_or_else(|| format!("{name} is not an integer argument")),
        Expr::Bin(l, op, r) => {
            let (l, r) = (eval(l, ints)?, eval(r, ints)?);
            let value = match op {
                '+' => l.checked_add(r),
                '-' => l.checked_sub(r),
                '*' => l.checked_mul(r),
                _ if r == 0 => return Err("division by zero".into()),
                _ => Some(l.div_euclid(r) - i64::from(r < 0 && l.rem_euclid(r) != 0)),
            };
            value.ok_or_else(|| "overflow".into())
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Num(i64),
    Name(String),
    Op(char),
    Open,
    Close,
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let start = i;
        i += 1;
        match c {
            ' ' | '\t' => {}
            '+' | '-' | '*' => tokens.push(Token::Op(c)),
            '/' if chars.get(i) == Some(&'/') => {
                i += 1;
                tokens.push(Token::Op('/'));
            }
            '(' => tokens.push(Token::Open),
            ')' => tokens.push(Token::Close),
            '0'..='9' => {
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
                let digits: String = chars[start..i].iter().collect();
                tokens.push(Token::Num(digits.parse().map_err(|_| "literal too large")?));
            }
            c if c.is_alphabetic() || c == '_' => {
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                tokens.push(Token::Name(chars[start..i].iter().collect()));
            }
            other => return Err(format!("unexpected {other:?}")),
        }
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn next_op(&self, ops: &[char]) -> Option<char> {
        match self.tokens.get(self.at) {
            Some(Token::Op(op)) if ops.contains(op) => Some(*op),
            _ => None,
        }
    }

    fn sum(&mut self) -> Result<Expr, String> {
        let mut left = self.product()?;
        while let Some(op) = self.next_op(&['+', '-']) {
            self.at += 1;
            left = Expr::Bin(Box::new(left), op, Box::new(self.product()?));
        }
        Ok(left)
    }

    fn product(&mut self) -> Result<Expr, String> {
        let mut left = self.atom()?;
        while let Some(op) = self.next_op(&['*', '/']) {
            self.at += 1;
            left = Expr::Bin(Box::new(left), op, Box::new(self.atom()?));
        }
        Ok(left)
    }

    fn atom(&mut self) -> Result<Expr, String> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        match token {
            Some(Token::Num(v)) => Ok(Expr::Lit(v)),
            Some(Token::Name(name)) => Ok(Expr::Name(name)),
            Some(Token::Open) => {
                let inner = self.sum()?;
                if self.tokens.get(self.at) != Some(&Token::Close) {
                    return Err("missing )".into());
                }
                self.at += 1;
                Ok(inner)
            }
            other => Err(format!("expected a number, a name or (, got {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(shape: &str, ints: &[(&str, i64)]) -> Vec<Option<i64>> {
        let ints = ints.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        parse(shape)
            .unwrap()
            .iter()
            .map(|d| match d {
                Dim::Any => None,
                Dim::Expr(e) => Some(eval(e, &ints).unwrap()),
            })
            .collect()
    }

    #[test]
    fn shapes_evaluate_over_integer_arguments() {
        assert_eq!(dims("n, n", &[("n", 4)]), vec![Some(4), Some(4)]);
        assert_eq!(
            dims("m, n + 1", &[("m", 2), ("n", 3)]),
            vec![Some(2), Some(4)]
        );
        assert_eq!(dims("2 * (n - 1) // 3", &[("n", 7)]), vec![Some(4)]);
        assert_eq!(dims("(0 - 7) // 2", &[]), vec![Some(-4)]);
        assert_eq!(dims("*, 3", &[]), vec![None, Some(3)]);
        assert_eq!(dims("n,", &[("n", 5)]), vec![Some(5)]);
        assert!(dims("", &[]).is_empty());
    }

    #[test]
    fn bad_shapes_and_names_are_errors() {
        assert!(parse("n ** 2").unwrap_err().contains("n ** 2"));
        assert!(parse("(n").unwrap_err().contains("missing )"));
        assert!(parse("n / 2").is_err());
        let parsed = parse("k").unwrap();
        let Dim::Expr(e) = &parsed[0] else {
            panic!("k is an expression")
        };
        assert_eq!(
            eval(e, &HashMap::new()).unwrap_err(),
            "k is not an integer argument"
        );
    }
}
