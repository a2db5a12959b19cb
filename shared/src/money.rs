//! Money is server work (R17): integer minor units, taxes computed here, never floats.

use serde::Serialize;

/// Decimal places of a currency's minor unit (ISO 4217).
pub fn exponent(currency: &str) -> u32 {
    match currency {
        "JPY" | "KRW" | "CLP" | "ISK" | "VND" => 0,
        "BHD" | "KWD" | "JOD" | "OMR" | "TND" => 3,
        _ => 2,
    }
}

/// Tax on a net amount at a rate in basis points, rounded half away from zero.
pub fn tax(net_minor: i64, rate_bp: i32) -> i64 {
    let product = i128::from(net_minor) * i128::from(rate_bp);
    let rounded =
        if product >= 0 { (product + 5_000) / 10_000 } else { (product - 5_000) / 10_000 };
    i64::try_from(rounded).unwrap_or(i64::MAX)
}

#[derive(Debug, Clone, Serialize, serde::Deserialize, schemars::JsonSchema, PartialEq)]
pub struct MoneyView {
    /// Amount in the currency's minor unit (cents).
    pub minor: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// The amount for people, e.g. "119.00 EUR".
    pub display: String,
}

pub fn present(minor: i64, currency: &str) -> MoneyView {
    let exp = exponent(currency);
    let sign = if minor < 0 { "-" } else { "" };
    let abs = minor.unsigned_abs();
    let display = if exp == 0 {
        format!("{sign}{abs} {currency}")
    } else {
        let unit = 10u64.pow(exp);
        format!("{sign}{}.{:0width$} {currency}", abs / unit, abs % unit, width = exp as usize)
    };
    MoneyView { minor, currency: currency.to_owned(), display }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tax_rounds_half_away_from_zero_in_minor_units() {
        assert_eq!(tax(10_000, 1_900), 1_900);
        assert_eq!(tax(1_050, 700), 74); // 73.5 -> 74
        assert_eq!(tax(-1_050, 700), -74);
    }

    #[test]
    fn display_follows_the_currency_exponent() {
        assert_eq!(present(11_900, "EUR").display, "119.00 EUR");
        assert_eq!(present(5, "EUR").display, "0.05 EUR");
        assert_eq!(present(1_200, "JPY").display, "1200 JPY");
        assert_eq!(present(-1_234, "KWD").display, "-1.234 KWD");
    }
}
