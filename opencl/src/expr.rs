//! Length and work-size expressions: integer arithmetic over scalar arguments.
//!
//! A spec writes a buffer's length or a work size as a small expression over
//! the kernel's integer scalars (`n`, `roundup(n, 64)`, `rows * cols`). The
//! grammar is deliberately tiny and the parser is our own: evalexpr (12 and
//! later) is AGPL-licensed, which this Apache-2.0 project cannot ship, and the
//! other expression crates evaluate floats or accept far more than a length
//! needs.
//!
//! ```text
//! expr    = term (("+" | "-") term)*
//! term    = unary (("*" | "/" | "%") unary)*
//! unary   = "-" unary | primary
//! primary = integer | name | name "(" expr "," expr ")" | "(" expr ")"
//! ```
//!
//! The functions are `roundup(a, b)` (`a` rounded up to a multiple of `b`),
//! `min(a, b)` and `max(a, b)`. Division truncates toward zero, as in C.
//! Evaluation is in `i128` with checked arithmetic, so overflow is an error
//! rather than a wrapped length. Expressions come from manifests that anyone
//! may upload, so their length ([`MAX_LEN`]) and nesting ([`MAX_DEPTH`]) are
//! bounded before any recursion can grow the stack.

use std::fmt;

/// The longest expression accepted, in bytes.
pub const MAX_LEN: usize = 256;

/// The deepest nesting of parentheses, calls and unary minus accepted.
pub const MAX_DEPTH: usize = 32;

/// Why an expression does not parse or evaluate. Columns count characters from 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExprError {
    /// Nothing to parse.
    #[error(
        "the expression is empty; write an integer expression such as `n` or `roundup(n, 64)`"
    )]
    Empty,
    /// Longer than [`MAX_LEN`].
    #[error("the expression is {len} bytes long; the limit is {max}: simplify it")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// [`MAX_LEN`].
        max: usize,
    },
    /// Nested deeper than [`MAX_DEPTH`].
    #[error(
        "the expression nests deeper than {max} levels at column {column}; remove parentheses"
    )]
    TooDeep {
        /// Where the limit was passed.
        column: usize,
        /// [`MAX_DEPTH`].
        max: usize,
    },
    /// A character or token that does not belong where it stands.
    #[error("unexpected {found} at column {column}; expected {expected}")]
    Unexpected {
        /// What was found, quoted.
        found: String,
        /// Where.
        column: usize,
        /// What would have fitted.
        expected: &'static str,
    },
    /// The expression stops in the middle.
    #[error("the expression ends early; expected {expected}")]
    UnexpectedEnd {
        /// What would have fitted.
        expected: &'static str,
    },
    /// An integer literal beyond `i128`.
    #[error("the number at column {column} is too large")]
    NumberTooLarge {
        /// Where it starts.
        column: usize,
    },
    /// A call of something other than `roundup`, `min` or `max`.
    #[error("unknown function `{name}` at column {column}; the functions are roundup(a, b), min(a, b) and max(a, b)")]
    UnknownFunction {
        /// The name called.
        name: String,
        /// Where.
        column: usize,
    },
    /// A function called with the wrong number of arguments.
    #[error("`{name}` at column {column} takes 2 arguments, not {got}")]
    Arity {
        /// The function.
        name: &'static str,
        /// Where.
        column: usize,
        /// How many it was given.
        got: usize,
    },
    /// A name with no value.
    #[error("unknown name `{name}`")]
    UnknownName {
        /// The name.
        name: String,
    },
    /// `/`, `%` or `roundup` by zero.
    #[error("division by zero")]
    DivisionByZero,
    /// A result beyond `i128`.
    #[error("overflow: the value is too large")]
    Overflow,
    /// `roundup` with a negative multiple.
    #[error("roundup(a, b) needs b > 0, but b is {multiple}")]
    NegativeMultiple {
        /// The multiple given.
        multiple: i128,
    },
}

/// A parsed expression, ready to evaluate for any values of its names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expr {
    text: String,
    root: Node,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Func {
    Roundup,
    Min,
    Max,
}

impl Func {
    fn from_name(name: &str) -> Option<Func> {
        match name {
            "roundup" => Some(Func::Roundup),
            "min" => Some(Func::Min),
            "max" => Some(Func::Max),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Func::Roundup => "roundup",
            Func::Min => "min",
            Func::Max => "max",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Int(i128),
    Name(String),
    Neg(Box<Node>),
    Binary(BinOp, Box<Node>, Box<Node>),
    Call(Func, Box<Node>, Box<Node>),
}

impl Expr {
    /// Parses `text`. Surrounding whitespace is ignored.
    pub fn parse(text: &str) -> Result<Expr, ExprError> {
        if text.len() > MAX_LEN {
            return Err(ExprError::TooLong {
                len: text.len(),
                max: MAX_LEN,
            });
        }
        let tokens = tokenize(text)?;
        let mut parser = Parser {
            tokens: &tokens,
            pos: 0,
            depth: 0,
        };
        if parser.peek().kind == TokenKind::End {
            return Err(ExprError::Empty);
        }
        let root = parser.expr()?;
        let next = parser.peek();
        if next.kind != TokenKind::End {
            return Err(next.unexpected("an operator or the end of the expression"));
        }
        Ok(Expr {
            text: text.trim().to_owned(),
            root,
        })
    }

    /// The expression as written (trimmed).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The names the expression uses, each once, in order of first use.
    pub fn names(&self) -> Vec<&str> {
        let mut names = Vec::new();
        collect_names(&self.root, &mut names);
        names
    }

    /// Evaluates the expression, looking names up with `lookup`.
    pub fn eval(&self, lookup: &dyn Fn(&str) -> Option<i128>) -> Result<i128, ExprError> {
        eval_node(&self.root, lookup)
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn collect_names<'a>(node: &'a Node, names: &mut Vec<&'a str>) {
    match node {
        Node::Int(_) => {}
        Node::Name(name) => {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
        Node::Neg(inner) => collect_names(inner, names),
        Node::Binary(_, left, right) | Node::Call(_, left, right) => {
            collect_names(left, names);
            collect_names(right, names);
        }
    }
}

fn eval_node(node: &Node, lookup: &dyn Fn(&str) -> Option<i128>) -> Result<i128, ExprError> {
    match node {
        Node::Int(value) => Ok(*value),
        Node::Name(name) => {
            lookup(name).ok_or_else(|| ExprError::UnknownName { name: name.clone() })
        }
        Node::Neg(inner) => eval_node(inner, lookup)?
            .checked_neg()
            .ok_or(ExprError::Overflow),
        Node::Binary(op, left, right) => {
            let a = eval_node(left, lookup)?;
            let b = eval_node(right, lookup)?;
            match op {
                BinOp::Add => a.checked_add(b).ok_or(ExprError::Overflow),
                BinOp::Sub => a.checked_sub(b).ok_or(ExprError::Overflow),
                BinOp::Mul => a.checked_mul(b).ok_or(ExprError::Overflow),
                BinOp::Div if b == 0 => Err(ExprError::DivisionByZero),
                BinOp::Div => a.checked_div(b).ok_or(ExprError::Overflow),
                BinOp::Rem if b == 0 => Err(ExprError::DivisionByZero),
                BinOp::Rem => a.checked_rem(b).ok_or(ExprError::Overflow),
            }
        }
        Node::Call(func, left, right) => {
            let a = eval_node(left, lookup)?;
            let b = eval_node(right, lookup)?;
            match func {
                Func::Min => Ok(a.min(b)),
                Func::Max => Ok(a.max(b)),
                Func::Roundup => roundup(a, b),
            }
        }
    }
}

/// The smallest multiple of `multiple` that is at least `value`.
fn roundup(value: i128, multiple: i128) -> Result<i128, ExprError> {
    if multiple == 0 {
        return Err(ExprError::DivisionByZero);
    }
    if multiple < 0 {
        return Err(ExprError::NegativeMultiple { multiple });
    }
    // `multiple` is positive, so `rem_euclid` is in 0..multiple and cannot overflow.
    let rest = value.rem_euclid(multiple);
    if rest == 0 {
        Ok(value)
    } else {
        value
            .checked_add(multiple - rest)
            .ok_or(ExprError::Overflow)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum TokenKind {
    Int(i128),
    Ident(String),
    Op(u8),
    End,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    kind: TokenKind,
    column: usize,
}

impl Token {
    fn unexpected(&self, expected: &'static str) -> ExprError {
        let found = match &self.kind {
            TokenKind::Int(value) => format!("number {value}"),
            TokenKind::Ident(name) => format!("name `{name}`"),
            TokenKind::Op(byte) => format!("'{}'", char::from(*byte)),
            TokenKind::End => return ExprError::UnexpectedEnd { expected },
        };
        ExprError::Unexpected {
            found,
            column: self.column,
            expected,
        }
    }
}

fn tokenize(text: &str) -> Result<Vec<Token>, ExprError> {
    // Report a non-ASCII character by its character column; after this check
    // bytes and characters coincide.
    if let Some((column, found)) = text.chars().enumerate().find(|(_, c)| !c.is_ascii()) {
        return Err(ExprError::Unexpected {
            found: format!("{found:?}"),
            column: column + 1,
            expected: "a number, a name, an operator or a parenthesis",
        });
    }
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        let column = i + 1;
        if byte.is_ascii_whitespace() {
            i += 1;
        } else if byte.is_ascii_digit() {
            let start = i;
            let mut value: i128 = 0;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                value = value
                    .checked_mul(10)
                    .and_then(|v| v.checked_add(i128::from(bytes[i] - b'0')))
                    .ok_or(ExprError::NumberTooLarge { column: start + 1 })?;
                i += 1;
            }
            if i < bytes.len() && (bytes[i].is_ascii_alphabetic() || bytes[i] == b'_') {
                return Err(ExprError::Unexpected {
                    found: format!("'{}'", char::from(bytes[i])),
                    column: i + 1,
                    expected: "an operator after the number (write `2 * n`, not `2n`)",
                });
            }
            tokens.push(Token {
                kind: TokenKind::Int(value),
                column,
            });
        } else if byte.is_ascii_alphabetic() || byte == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            tokens.push(Token {
                kind: TokenKind::Ident(text[start..i].to_owned()),
                column,
            });
        } else if b"+-*/%(),".contains(&byte) {
            tokens.push(Token {
                kind: TokenKind::Op(byte),
                column,
            });
            i += 1;
        } else {
            return Err(ExprError::Unexpected {
                found: format!("'{}'", char::from(byte)),
                column,
                expected: "a number, a name, one of + - * / % or a parenthesis",
            });
        }
    }
    tokens.push(Token {
        kind: TokenKind::End,
        column: bytes.len() + 1,
    });
    Ok(tokens)
}

struct Parser<'t> {
    tokens: &'t [Token],
    pos: usize,
    depth: usize,
}

const OPERAND: &str = "a number, a name, '-' or '('";

impl Parser<'_> {
    fn peek(&self) -> &Token {
        // `tokenize` always ends with `End`, and `pos` never passes it.
        let last = self.tokens.len().saturating_sub(1);
        &self.tokens[self.pos.min(last)]
    }

    fn bump(&mut self) {
        if self.pos + 1 < self.tokens.len() {
            self.pos += 1;
        }
    }

    fn is_op(&self, op: u8) -> bool {
        self.peek().kind == TokenKind::Op(op)
    }

    fn enter(&mut self, column: usize) -> Result<(), ExprError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(ExprError::TooDeep {
                column,
                max: MAX_DEPTH,
            });
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }

    fn expr(&mut self) -> Result<Node, ExprError> {
        let mut left = self.term()?;
        loop {
            let op = match self.peek().kind {
                TokenKind::Op(b'+') => BinOp::Add,
                TokenKind::Op(b'-') => BinOp::Sub,
                _ => return Ok(left),
            };
            self.bump();
            let right = self.term()?;
            left = Node::Binary(op, Box::new(left), Box::new(right));
        }
    }

    fn term(&mut self) -> Result<Node, ExprError> {
        let mut left = self.unary()?;
        loop {
            let op = match self.peek().kind {
                TokenKind::Op(b'*') => BinOp::Mul,
                TokenKind::Op(b'/') => BinOp::Div,
                TokenKind::Op(b'%') => BinOp::Rem,
                _ => return Ok(left),
            };
            self.bump();
            let right = self.unary()?;
            left = Node::Binary(op, Box::new(left), Box::new(right));
        }
    }

    fn unary(&mut self) -> Result<Node, ExprError> {
        if self.is_op(b'-') {
            let column = self.peek().column;
            self.bump();
            self.enter(column)?;
            let inner = self.unary()?;
            self.leave();
            return Ok(match inner {
                // Fold literals so `-5` is a number, as people read it.
                Node::Int(value) => Node::Int(-value),
                other => Node::Neg(Box::new(other)),
            });
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Node, ExprError> {
        let token = self.peek().clone();
        match token.kind {
            TokenKind::Int(value) => {
                self.bump();
                Ok(Node::Int(value))
            }
            TokenKind::Ident(name) => {
                self.bump();
                if !self.is_op(b'(') {
                    return Ok(Node::Name(name));
                }
                let func = Func::from_name(&name).ok_or(ExprError::UnknownFunction {
                    name,
                    column: token.column,
                })?;
                self.bump();
                self.enter(token.column)?;
                let mut args = vec![self.expr()?];
                while self.is_op(b',') {
                    self.bump();
                    args.push(self.expr()?);
                }
                if !self.is_op(b')') {
                    return Err(self.peek().unexpected("',' or ')'"));
                }
                self.bump();
                self.leave();
                let got = args.len();
                let mut args = args.into_iter();
                match (args.next(), args.next(), args.next()) {
                    (Some(a), Some(b), None) => Ok(Node::Call(func, Box::new(a), Box::new(b))),
                    _ => Err(ExprError::Arity {
                        name: func.name(),
                        column: token.column,
                        got,
                    }),
                }
            }
            TokenKind::Op(b'(') => {
                self.bump();
                self.enter(token.column)?;
                let inner = self.expr()?;
                if !self.is_op(b')') {
                    return Err(self.peek().unexpected("an operator or ')'"));
                }
                self.bump();
                self.leave();
                Ok(inner)
            }
            _ => Err(token.unexpected(OPERAND)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn eval(text: &str, vars: &[(&str, i128)]) -> Result<i128, ExprError> {
        let expr = Expr::parse(text)?;
        expr.eval(&|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| *v))
    }

    #[test]
    fn arithmetic_follows_c_precedence_and_truncation() {
        assert_eq!(eval("1 + 2 * 3", &[]), Ok(7));
        assert_eq!(eval("(1 + 2) * 3", &[]), Ok(9));
        assert_eq!(eval("10 - 4 - 3", &[]), Ok(3));
        assert_eq!(eval("100 / 10 / 5", &[]), Ok(2));
        assert_eq!(eval("7 / 2", &[]), Ok(3));
        assert_eq!(eval("-7 / 2", &[]), Ok(-3));
        assert_eq!(eval("17 % 5", &[]), Ok(2));
        assert_eq!(eval("- -3", &[]), Ok(3));
        assert_eq!(eval("2 * -n", &[("n", 4)]), Ok(-8));
    }

    #[test]
    fn functions_compute_what_they_say() {
        assert_eq!(eval("roundup(n, 64)", &[("n", 1000)]), Ok(1024));
        assert_eq!(eval("roundup(1024, 64)", &[]), Ok(1024));
        assert_eq!(eval("roundup(0, 16)", &[]), Ok(0));
        assert_eq!(eval("roundup(-5, 4)", &[]), Ok(-4));
        assert_eq!(eval("min(a, b) + max(a, b)", &[("a", 3), ("b", 9)]), Ok(12));
        assert_eq!(eval("min(max(n, 1), 8)", &[("n", 0)]), Ok(1));
        // A name is only a function when called, so an argument may be named `min`.
        assert_eq!(eval("min + 1", &[("min", 4)]), Ok(5));
    }

    #[test]
    fn names_are_listed_once_in_order() {
        let expr = Expr::parse("rows * cols + roundup(rows, tile)").unwrap();
        assert_eq!(expr.names(), vec!["rows", "cols", "tile"]);
        assert_eq!(expr.to_string(), "rows * cols + roundup(rows, tile)");
        assert!(Expr::parse(" 42 ").unwrap().names().is_empty());
    }

    #[test]
    fn syntax_errors_name_the_column() {
        let err = Expr::parse("(n + 1))").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unexpected ')' at column 8; expected an operator or the end of the expression"
        );
        assert_eq!(
            Expr::parse("n + * 2").unwrap_err(),
            ExprError::Unexpected {
                found: "'*'".into(),
                column: 5,
                expected: OPERAND
            }
        );
        assert_eq!(
            Expr::parse("n +").unwrap_err(),
            ExprError::UnexpectedEnd { expected: OPERAND }
        );
        assert!(matches!(
            Expr::parse("(n + 1").unwrap_err(),
            ExprError::UnexpectedEnd { .. }
        ));
        assert!(matches!(
            Expr::parse("n $ 2").unwrap_err(),
            ExprError::Unexpected { column: 3, .. }
        ));
        assert!(matches!(
            Expr::parse("2n").unwrap_err(),
            ExprError::Unexpected { column: 2, .. }
        ));
        assert!(matches!(
            Expr::parse("n ≥ 2").unwrap_err(),
            ExprError::Unexpected { column: 3, .. }
        ));
        assert_eq!(Expr::parse("   ").unwrap_err(), ExprError::Empty);
    }

    #[test]
    fn calls_are_checked() {
        assert_eq!(
            Expr::parse("pow(n, 2)").unwrap_err(),
            ExprError::UnknownFunction {
                name: "pow".into(),
                column: 1
            }
        );
        assert_eq!(
            Expr::parse("1 + min(n)").unwrap_err(),
            ExprError::Arity {
                name: "min",
                column: 5,
                got: 1
            }
        );
        assert!(matches!(
            Expr::parse("max(1, 2, 3)").unwrap_err(),
            ExprError::Arity { got: 3, .. }
        ));
    }

    #[test]
    fn evaluation_errors() {
        assert_eq!(
            eval("n + m", &[("n", 1)]),
            Err(ExprError::UnknownName { name: "m".into() })
        );
        assert_eq!(eval("n / 0", &[("n", 1)]), Err(ExprError::DivisionByZero));
        assert_eq!(
            eval("n % (n - n)", &[("n", 1)]),
            Err(ExprError::DivisionByZero)
        );
        assert_eq!(
            eval("roundup(n, 0)", &[("n", 1)]),
            Err(ExprError::DivisionByZero)
        );
        assert_eq!(
            eval("roundup(n, -2)", &[("n", 1)]),
            Err(ExprError::NegativeMultiple { multiple: -2 })
        );
        let big = i128::from(u64::MAX);
        assert_eq!(eval("a * a * a", &[("a", big)]), Err(ExprError::Overflow));
        assert_eq!(
            eval("roundup(a * a * 127, 1000)", &[("a", big)]),
            Err(ExprError::Overflow)
        );
        assert!(matches!(
            Expr::parse("999999999999999999999999999999999999999999"),
            Err(ExprError::NumberTooLarge { column: 1 })
        ));
    }

    #[test]
    fn hostile_sizes_are_refused_before_recursing() {
        let deep = format!("{}1{}", "(".repeat(40), ")".repeat(40));
        assert!(matches!(
            Expr::parse(&deep),
            Err(ExprError::TooDeep { max: MAX_DEPTH, .. })
        ));
        let ok = format!("{}1{}", "(".repeat(MAX_DEPTH), ")".repeat(MAX_DEPTH));
        assert_eq!(eval(&ok, &[]), Ok(1));
        assert!(matches!(
            Expr::parse(&"-".repeat(100)),
            Err(ExprError::TooDeep { .. })
        ));
        let long = "1+".repeat(200) + "1";
        assert!(matches!(
            Expr::parse(&long),
            Err(ExprError::TooLong {
                len: 401,
                max: MAX_LEN
            })
        ));
        // The longest chain within the limit evaluates without trouble.
        let chain = "1+".repeat(127) + "1";
        assert_eq!(eval(&chain, &[]), Ok(128));
    }
}
