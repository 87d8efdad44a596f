//! Kubernetes resource quantities, exactly as `k8s.io/apimachinery/pkg/api/resource`
//! parses, compares, adds and formats them — with arbitrary precision and no
//! floating point anywhere a result depends on it.
//!
//! A quantity is a decimal number with a format: `DecimalSI` (`1.5`, `500m`,
//! `40G`), `BinarySI` (`40Gi`) or `DecimalExponent` (`4e9`). Parsing follows
//! Kubernetes step by step, quirks included:
//! - values are kept exactly, but anything finer than `1n` is rounded up (away
//!   from zero) to the next nano, so asking for a little gives a little;
//! - a `BinarySI` value above 2^63-1 is capped there; one between 0 and 1 becomes
//!   `DecimalSI`;
//! - the string is kept as given when Kubernetes would keep it (its own
//!   canonical-looking fast path: `01` stays `01`), otherwise it is formatted
//!   canonically: integer mantissa, exponent a multiple of three, the largest
//!   suffix that keeps the mantissa whole (`1500m`, `1k`, `2Ki`, `1e3`);
//! - as in Kubernetes, a `DecimalSI` exponent beyond `E` (10^18) or a `BinarySI`
//!   one beyond `Ei` has no suffix and is printed without one.

use std::cmp::Ordering;
use std::fmt;

use num_bigint::{BigInt, Sign};
use num_integer::Integer;
use num_traits::{Signed, ToPrimitive, Zero};

/// How a quantity is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// `4e9`, `12e-3`.
    DecimalExponent,
    /// `40Gi`, `512Mi`.
    BinarySI,
    /// `1.5`, `500m`, `40G`.
    DecimalSI,
}

/// Why a string is not a quantity, in Kubernetes' words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error(
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    FormatWrong,
    #[error("unable to parse numeric part of quantity")]
    Numeric,
    #[error("unable to parse quantity's suffix")]
    Suffix,
}

/// A mantissa: an `i64` where it fits (no allocation, the common case), a
/// big integer otherwise. Always the `Small` form when the value fits.
#[derive(Clone, Debug)]
enum Mantissa {
    Small(i64),
    Big(Box<BigInt>),
}

impl Mantissa {
    fn from_big(value: BigInt) -> Mantissa {
        match value.to_i64() {
            Some(v) => Mantissa::Small(v),
            None => Mantissa::Big(Box::new(value)),
        }
    }

    fn big(&self) -> BigInt {
        match self {
            Mantissa::Small(v) => BigInt::from(*v),
            Mantissa::Big(b) => (**b).clone(),
        }
    }

    fn is_zero(&self) -> bool {
        matches!(self, Mantissa::Small(0))
    }

    fn sign(&self) -> i32 {
        match self {
            Mantissa::Small(v) => v.signum() as i32,
            Mantissa::Big(b) => match b.sign() {
                Sign::Minus => -1,
                Sign::NoSign => 0,
                Sign::Plus => 1,
            },
        }
    }

    fn neg(self) -> Mantissa {
        match self {
            Mantissa::Small(v) => match v.checked_neg() {
                Some(n) => Mantissa::Small(n),
                None => Mantissa::from_big(-BigInt::from(v)),
            },
            Mantissa::Big(b) => Mantissa::from_big(-*b),
        }
    }
}

/// The most decimal places two operands are aligned by when they are added:
/// beyond it, the smaller one is dropped (Kubernetes would build a number of
/// that many digits; a quantity like `1e2000000000` must not exhaust memory).
const MAX_ALIGNMENT: u32 = 4096;

/// Decimal digits of a mantissa's magnitude.
fn digits(m: &Mantissa) -> i64 {
    match m {
        Mantissa::Small(v) => v.unsigned_abs().checked_ilog10().map_or(1, |d| d + 1) as i64,
        Mantissa::Big(b) => b.magnitude().to_string().len() as i64,
    }
}

/// 10^n as an `i128`, for n ≤ 38.
fn pow10_i128(n: u32) -> Option<i128> {
    10i128.checked_pow(n)
}

/// An exact quantity: `mantissa × 10^exponent`, kept with no trailing zeros in
/// the mantissa so that equal values have equal parts.
#[derive(Clone, Debug)]
pub struct Quantity {
    mantissa: Mantissa,
    exponent: i32,
    format: Format,
    /// The parsed string, when Kubernetes keeps it as the quantity's text.
    kept: Option<Box<str>>,
}

/// The pieces `parseQuantityString` cuts a quantity into.
struct Pieces<'a> {
    positive: bool,
    /// Sign, digits, point and fraction, as written.
    value: &'a str,
    /// Integer digits without leading zeros (`"0"` when there are none).
    num: &'a str,
    denom: &'a str,
    suffix: &'a str,
}

fn split(s: &str) -> Result<Pieces<'_>, ParseError> {
    let b = s.as_bytes();
    let end = b.len();
    let mut pos = 0;
    let mut positive = true;
    if pos < end {
        match b[0] {
            b'-' => {
                positive = false;
                pos += 1;
            }
            b'+' => pos += 1,
            _ => {}
        }
    }
    // Leading zeros; nothing but zeros is zero.
    while pos < end && b[pos] == b'0' {
        pos += 1;
    }
    if pos >= end {
        return Ok(Pieces {
            positive,
            value: "0",
            num: "0",
            denom: "",
            suffix: "",
        });
    }
    let num_start = pos;
    while pos < end && b[pos].is_ascii_digit() {
        pos += 1;
    }
    let whole = |value| Pieces {
        positive,
        value,
        num: &s[num_start..],
        denom: "",
        suffix: "",
    };
    if pos >= end {
        return Ok(whole(s));
    }
    let num = if pos == num_start {
        "0"
    } else {
        &s[num_start..pos]
    };
    let mut denom = "";
    if b[pos] == b'.' {
        pos += 1;
        let denom_start = pos;
        while pos < end && b[pos].is_ascii_digit() {
            pos += 1;
        }
        denom = &s[denom_start..pos];
        if pos >= end {
            return Ok(Pieces {
                positive,
                value: s,
                num,
                denom,
                suffix: "",
            });
        }
    }
    let value = &s[..pos];
    let suffix_start = pos;
    while pos < end && b"eEinumkKMGTP".contains(&b[pos]) {
        pos += 1;
    }
    if pos < end && matches!(b[pos], b'-' | b'+') {
        pos += 1;
    }
    while pos < end && b[pos].is_ascii_digit() {
        pos += 1;
    }
    if pos < end {
        return Err(ParseError::FormatWrong);
    }
    Ok(Pieces {
        positive,
        value,
        num,
        denom,
        suffix: &s[suffix_start..],
    })
}

/// Base, exponent and format of a suffix.
fn interpret(suffix: &str) -> Option<(u32, i32, Format)> {
    let decimal = |e| Some((10, e, Format::DecimalSI));
    let binary = |e| Some((2, e, Format::BinarySI));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        s if s.len() > 1 && (s.starts_with('e') || s.starts_with('E')) => {
            // strconv.ParseInt(s[1:], 10, 64), then int32(): Go truncates.
            let exponent: i64 = go_parse_int(&s[1..])?;
            Some((10, exponent as i32, Format::DecimalExponent))
        }
        _ => None,
    }
}

/// `strconv.ParseInt(s, 10, 64)`: an optional sign and decimal digits.
fn go_parse_int(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn pow10(n: u32) -> BigInt {
    BigInt::from(10u32).pow(n)
}

/// Divides by 10^n rounding away from zero.
fn div_pow10_round_up(value: &BigInt, n: u32) -> BigInt {
    // |value| < 10^n: a non-zero value rounds to ±1 without computing 10^n.
    if value.is_zero() {
        return BigInt::zero();
    }
    if u64::from(n) > value.magnitude().bits() {
        return value.signum();
    }
    let (q, r) = value.div_rem(&pow10(n));
    if r.is_zero() {
        q
    } else if value.is_negative() {
        q - 1
    } else {
        q + 1
    }
}

impl Quantity {
    fn new(mantissa: BigInt, exponent: i32, format: Format) -> Quantity {
        if let Some(small) = mantissa.to_i64() {
            return Quantity::small(small, exponent, format);
        }
        let ten = BigInt::from(10u32);
        let (mut mantissa, mut exponent) = (mantissa, exponent);
        loop {
            let (q, r) = mantissa.div_rem(&ten);
            if !r.is_zero() {
                break;
            }
            mantissa = q;
            exponent += 1;
        }
        Quantity {
            mantissa: Mantissa::from_big(mantissa),
            exponent,
            format,
            kept: None,
        }
    }

    /// `mantissa × 10^exponent` without allocating.
    fn small(mut mantissa: i64, mut exponent: i32, format: Format) -> Quantity {
        if mantissa == 0 {
            exponent = 0;
        } else {
            while mantissa % 10 == 0 {
                mantissa /= 10;
                exponent += 1;
            }
        }
        Quantity {
            mantissa: Mantissa::Small(mantissa),
            exponent,
            format,
            kept: None,
        }
    }

    fn from_i128(value: i128, exponent: i32, format: Format) -> Quantity {
        match i64::try_from(value) {
            Ok(v) => Quantity::small(v, exponent, format),
            Err(_) => Quantity::new(BigInt::from(value), exponent, format),
        }
    }

    /// Zero, `DecimalSI`.
    pub fn zero() -> Quantity {
        Quantity::small(0, 0, Format::DecimalSI)
    }

    /// `value × 10^exponent` in `format`.
    pub fn from_parts(value: impl Into<BigInt>, exponent: i32, format: Format) -> Quantity {
        Quantity::new(value.into(), exponent, format)
    }

    /// An integer, `DecimalSI`.
    pub fn from_i64(value: i64) -> Quantity {
        Quantity::small(value, 0, Format::DecimalSI)
    }

    /// Parses a quantity as Kubernetes' `ParseQuantity` does.
    pub fn parse(s: &str) -> Result<Quantity, ParseError> {
        if s.is_empty() {
            return Err(ParseError::FormatWrong);
        }
        if s == "0" {
            let mut zero = Quantity::zero();
            zero.kept = Some(s.into());
            return Ok(zero);
        }
        let p = split(s)?;
        let (base, exponent, format) = interpret(p.suffix).ok_or(ParseError::Suffix)?;

        // Kubernetes' int64 fast path: where it applies, the string is kept
        // when it already looks canonical (and "." alone is zero).
        if let Some(value) = Self::fast_path(&p, exponent, format, s) {
            return Ok(value);
        }

        // The exact path.
        let digits: String = p
            .value
            .bytes()
            .filter(u8::is_ascii_digit)
            .map(char::from)
            .collect();
        if digits.is_empty() {
            return Err(ParseError::Numeric);
        }
        let fraction = p.value.split_once('.').map_or(0, |(_, f)| f.len() as i64);
        let mut mantissa: BigInt = digits.parse().map_err(|_| ParseError::Numeric)?;
        let mut scale: i64 = -fraction;
        match base {
            10 => scale += i64::from(exponent),
            _ => mantissa <<= exponent as usize,
        }
        // Rounded up to whole nanos, away from zero.
        if scale < -9 {
            let shift = u32::try_from(-9 - scale).map_err(|_| ParseError::Numeric)?;
            mantissa = div_pow10_round_up(&mantissa, shift);
            scale = -9;
        }
        let mut format = format;
        let mut q = Quantity::new(
            mantissa,
            i32::try_from(scale).map_err(|_| ParseError::Numeric)?,
            format,
        );
        if format == Format::BinarySI {
            let max = Quantity::from_i64(i64::MAX);
            if q > max {
                q = max;
            }
            if q < Quantity::from_i64(1) && !q.is_zero() {
                format = Format::DecimalSI;
            }
        }
        q.format = format;
        if !p.positive {
            q.mantissa = q.mantissa.neg();
        }
        Ok(q)
    }

    fn fast_path(p: &Pieces<'_>, exponent: i32, format: Format, s: &str) -> Option<Quantity> {
        let digits = (p.num.len() + p.denom.len()) as i32;
        let (mut scale, multiplier, precision) = match format {
            Format::DecimalExponent | Format::DecimalSI => (exponent, 1i64, 18 - digits),
            Format::BinarySI if exponent >= 0 && p.denom.is_empty() => {
                // float32(exponent)*3/10, truncated, as Go computes it.
                let approx = (exponent as f32 * 3.0 / 10.0) as i32;
                (
                    0,
                    1i64.checked_shl(exponent as u32)?,
                    15 - p.num.len() as i32 - approx - 1,
                )
            }
            Format::BinarySI => return None,
        };
        if precision < 0 {
            return None;
        }
        scale -= p.denom.len() as i32;
        if scale < -9 {
            return None;
        }
        // At most 18 digits here: the value fits an i64.
        let mut value: i64 = 0;
        for c in p.num.bytes().chain(p.denom.bytes()) {
            value = value.checked_mul(10)?.checked_add(i64::from(c - b'0'))?;
        }
        let mut result = value.checked_mul(multiplier)?;
        if !p.positive {
            result = -result;
        }
        let mut q = Quantity::small(result, scale, format);
        let keep = match format {
            Format::BinarySI => exponent % 10 == 0 && value & 0x07 != 0,
            _ => {
                let last = |n: usize| {
                    let all = p.num.len() + p.denom.len();
                    (all >= n)
                        && p.num
                            .bytes()
                            .chain(p.denom.bytes())
                            .skip(all - n)
                            .all(|c| c == b'0')
                };
                let first = p.num.bytes().chain(p.denom.bytes()).next();
                scale % 3 == 0 && !last(3) && first != Some(b'0')
            }
        };
        if keep {
            q.kept = Some(s.into());
        }
        Some(q)
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn is_zero(&self) -> bool {
        self.mantissa.is_zero()
    }

    /// -1, 0 or 1.
    pub fn sign(&self) -> i32 {
        self.mantissa.sign()
    }

    /// The value as an exact `i64`, if it is an integer in range.
    pub fn as_i64(&self) -> Option<i64> {
        // A non-zero mantissa times 10^19 is beyond i64 (and 10^huge is not computed).
        if self.exponent < 0 || (self.exponent > 18 && !self.is_zero()) {
            return None;
        }
        if let (Mantissa::Small(m), Some(p)) = (&self.mantissa, pow10_i128(self.exponent as u32)) {
            return i64::try_from(i128::from(*m).checked_mul(p)?).ok();
        }
        (self.mantissa.big() * pow10(self.exponent as u32)).to_i64()
    }

    /// The value rounded to an integer away from zero and clamped to `i64`,
    /// as Kubernetes' `Quantity.Value()` gives it.
    pub fn value_rounded_up(&self) -> i64 {
        if self.exponent >= 0 {
            return self
                .as_i64()
                .unwrap_or(if self.sign() < 0 { i64::MIN } else { i64::MAX });
        }
        let mantissa = self.mantissa.big();
        if self.exponent.unsigned_abs() as usize > mantissa.magnitude().to_string().len() {
            // |value| < 1: away from zero is the sign itself.
            return i64::from(self.sign());
        }
        let divisor = pow10(self.exponent.unsigned_abs());
        let (q, r) = mantissa.div_rem(&divisor);
        let q = if r.is_zero() {
            q
        } else {
            q + BigInt::from(self.sign())
        };
        q.to_i64()
            .unwrap_or(if self.sign() < 0 { i64::MIN } else { i64::MAX })
    }

    /// The nearest `f64` (for display and CEL's `asApproximateFloat`, never for
    /// comparisons).
    pub fn as_approximate_f64(&self) -> f64 {
        let m = match &self.mantissa {
            Mantissa::Small(v) => *v as f64,
            Mantissa::Big(b) => b.to_f64().unwrap_or(f64::NAN),
        };
        m * 10f64.powi(self.exponent)
    }

    /// `self + other`; the format is `self`'s, or `other`'s when `self` is zero.
    pub fn add(&self, other: &Quantity) -> Quantity {
        self.combine(other, false)
    }

    /// `self - other`; the format is `self`'s, or `other`'s when `self` is zero.
    pub fn sub(&self, other: &Quantity) -> Quantity {
        self.combine(other, true)
    }

    fn combine(&self, other: &Quantity, negate_other: bool) -> Quantity {
        let exponent = self.exponent.min(other.exponent);
        let format = if self.is_zero() {
            other.format
        } else {
            self.format
        };
        let (da, db) = (
            (self.exponent - exponent) as u32,
            (other.exponent - exponent) as u32,
        );
        if let (Mantissa::Small(a), Mantissa::Small(b), Some(pa), Some(pb)) = (
            &self.mantissa,
            &other.mantissa,
            pow10_i128(da).filter(|_| da <= 18),
            pow10_i128(db).filter(|_| db <= 18),
        ) {
            let (a, b) = (i128::from(*a) * pa, i128::from(*b) * pb);
            let sum = if negate_other { a - b } else { a + b };
            return Quantity::from_i128(sum, exponent, format);
        }
        if da.max(db) > MAX_ALIGNMENT {
            // The exact sum would need more than MAX_ALIGNMENT digits: the
            // smaller operand is below 10^-4096 of the larger, and is dropped.
            let larger_is_self = da > db;
            let mut result = if larger_is_self {
                self.clone()
            } else if negate_other {
                Quantity::from_parts(-other.mantissa.big(), other.exponent, format)
            } else {
                other.clone()
            };
            result.format = format;
            result.kept = None;
            return result;
        }
        let a = self.mantissa.big() * pow10(da);
        let b = other.mantissa.big() * pow10(db);
        Quantity::new(if negate_other { a - b } else { a + b }, exponent, format)
    }

    /// The canonical text, as `CanonicalizeBytes` writes it.
    pub fn canonical(&self) -> String {
        if self.is_zero() {
            return "0".into();
        }
        let mut format = self.format;
        let mut rounded = None;
        if format == Format::BinarySI {
            let small = *self > Quantity::from_i64(-1024) && *self < Quantity::from_i64(1024);
            if small {
                format = Format::DecimalSI;
            } else if self.exponent < 0 || self.exponent > 60 {
                // Not a whole number: Kubernetes shows it as DecimalSI rather
                // than round. (Beyond 10^60 — out of reach of parsing, which
                // caps BinarySI at 2^63-1 — it is shown as DecimalSI too.)
                format = Format::DecimalSI;
            } else {
                rounded = Some(self.mantissa.big() * pow10(self.exponent as u32));
            }
        }
        match (format, rounded) {
            (Format::BinarySI, Some(mut whole)) => {
                let k = BigInt::from(1024u32);
                let mut times = 0;
                loop {
                    let (q, r) = whole.div_rem(&k);
                    if !r.is_zero() {
                        break;
                    }
                    whole = q;
                    times += 1;
                }
                let suffix = match times {
                    0 => "",
                    1 => "Ki",
                    2 => "Mi",
                    3 => "Gi",
                    4 => "Ti",
                    5 => "Pi",
                    6 => "Ei",
                    _ => "",
                };
                format!("{whole}{suffix}")
            }
            (format, _) => {
                // Already without trailing zeros: floor the exponent to a multiple of 3.
                let mut exponent = self.exponent;
                let mut mantissa = self.mantissa.big();
                let ten = BigInt::from(10u32);
                while exponent % 3 != 0 {
                    mantissa *= &ten;
                    exponent -= 1;
                }
                let suffix = match format {
                    Format::DecimalExponent if exponent == 0 => String::new(),
                    Format::DecimalExponent => format!("e{exponent}"),
                    _ => match exponent {
                        -9 => "n",
                        -6 => "u",
                        -3 => "m",
                        3 => "k",
                        6 => "M",
                        9 => "G",
                        12 => "T",
                        15 => "P",
                        18 => "E",
                        _ => "",
                    }
                    .to_string(),
                };
                format!("{mantissa}{suffix}")
            }
        }
    }
}

impl fmt::Display for Quantity {
    /// The text Kubernetes serialises: the parsed string where it keeps it,
    /// the canonical form otherwise.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kept {
            Some(s) => f.write_str(s),
            None => f.write_str(&self.canonical()),
        }
    }
}

impl std::str::FromStr for Quantity {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

impl PartialEq for Quantity {
    /// Equal values, whatever their format (`Quantity.Equal`).
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    #[inline]
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// 10^n for n ≤ 18, the scales two `i64` mantissas are aligned by in an
/// `i128` without overflow (|m| < 2^63, 10^18 < 2^60).
const POW10_I128: [i128; 19] = {
    let mut table = [1i128; 19];
    let mut i = 1;
    while i < 19 {
        table[i] = table[i - 1] * 10;
        i += 1;
    }
    table
};

impl Ord for Quantity {
    #[inline]
    fn cmp(&self, other: &Self) -> Ordering {
        // The common case first: two mantissas that fit an i64, exponents at
        // most 18 apart — aligned in an i128 and compared, nothing else
        // (no signs, no magnitudes, no allocation).
        if let (Mantissa::Small(x), Mantissa::Small(y)) = (&self.mantissa, &other.mantissa) {
            let d = i64::from(self.exponent) - i64::from(other.exponent);
            if d == 0 {
                return x.cmp(y);
            }
            if let Some(&p) = POW10_I128.get(d.unsigned_abs() as usize) {
                let (x, y) = (i128::from(*x), i128::from(*y));
                return if d > 0 {
                    (x * p).cmp(&y)
                } else {
                    x.cmp(&(y * p))
                };
            }
        }
        // Normalised: equal exponents compare mantissas; otherwise scale the one
        // with the larger exponent down to the other's.
        let (a, b) = (&self.mantissa, &other.mantissa);
        // Different signs (or zero) decide at once.
        let (sa, sb) = (a.sign(), b.sign());
        if sa != sb {
            return sa.cmp(&sb);
        }
        if sa == 0 {
            return Ordering::Equal;
        }
        // Different magnitudes (position of the leading digit) decide without
        // scaling, whatever the exponents.
        let (ka, kb) = (
            digits(a) + i64::from(self.exponent),
            digits(b) + i64::from(other.exponent),
        );
        if ka != kb {
            let by_magnitude = ka.cmp(&kb);
            return if sa > 0 {
                by_magnitude
            } else {
                by_magnitude.reverse()
            };
        }
        // Same magnitude: the exponents differ by at most the mantissas'
        // digits (two i64 mantissas were compared above).
        let d = self.exponent - other.exponent;
        match d.cmp(&0) {
            Ordering::Equal => a.big().cmp(&b.big()),
            Ordering::Greater => (a.big() * pow10(d as u32)).cmp(&b.big()),
            Ordering::Less => a.big().cmp(&(b.big() * pow10(d.unsigned_abs()))),
        }
    }
}

impl std::hash::Hash for Quantity {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // Normalised parts: equal values hash alike.
        match &self.mantissa {
            Mantissa::Small(v) => v.hash(state),
            Mantissa::Big(b) => b.hash(state),
        }
        self.exponent.hash(state);
    }
}
