//! Exporting a range of bookings, however many: a long read in pages, with progress (R22).

use super::*;

/// Summarize every booking in a time range (possibly thousands), page by page.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExportBookingsInput {
    /// Start of the range, inclusive (as in find_bookings).
    pub from: String,
    /// End of the range (as in find_bookings).
    pub to: String,
    /// IANA zone for dates and local times.
    #[serde(default)]
    pub zone: Option<String>,
    /// Only this status.
    #[serde(default)]
    pub status: Option<String>,
}

#[derive(Debug, serde::Serialize, JsonSchema)]
pub struct StatusCount {
    pub status: String,
    pub count: i64,
}

#[derive(Debug, serde::Serialize, JsonSchema)]
pub struct ExportSummary {
    pub from: crate::time::TimeView,
    pub to: crate::time::TimeView,
    pub count: i64,
    pub by_status: Vec<StatusCount>,
    /// Sum of booking totals per currency.
    pub totals: Vec<crate::money::MoneyView>,
    /// The first bookings of the range; page through the rest with find_bookings.
    pub first: Vec<String>,
    /// Arguments for find_bookings that continue after `first`.
    #[schemars(with = "Option<serde_json::Map<String, serde_json::Value>>")]
    pub continue_with: Option<ContinueWith>,
}

/// An export in progress: one page of 200 bookings per step.
pub struct Export {
    find: FindBookingsInput,
    from: jiff::Timestamp,
    to: jiff::Timestamp,
    zone: String,
    pub total: i64,
    pub seen: i64,
    by_status: std::collections::BTreeMap<String, i64>,
    totals: std::collections::BTreeMap<String, i64>,
    first: Vec<String>,
    after_first: Option<String>,
    done: bool,
}

pub(super) const EXPORT_PAGE: u32 = 100;

pub async fn export_start(
    ds: &Services,
    ctx: &OpCtx,
    input: &ExportBookingsInput,
) -> Result<Export> {
    ctx.require(Right::BookingsRead)?;
    let zone = nonempty(&input.zone).unwrap_or(&ctx.tenant().zone_name).to_owned();
    let find = FindBookingsInput {
        from: Some(input.from.clone()),
        to: Some(input.to.clone()),
        zone: Some(zone.clone()),
        status: input.status.clone(),
        limit: Some(EXPORT_PAGE),
        ..Default::default()
    };
    let mut f = filter(&find)?;
    let (Some(from), Some(to)) = (f.from, f.to) else {
        return Err(Error::invalid("from", "an export needs both `from` and `to`"));
    };
    f.limit = i64::MAX;
    crate::datastore::booking_filter_refs(ds.pool(), ctx, &f).await?;
    let total = ds.booking_count(ctx, &f).await?;
    Ok(Export {
        find,
        from,
        to,
        zone,
        total,
        seen: 0,
        by_status: Default::default(),
        totals: Default::default(),
        first: Vec::new(),
        after_first: None,
        done: false,
    })
}

impl Export {
    /// Reads the next page; false when the range is exhausted.
    pub async fn step(&mut self, ds: &Services, ctx: &OpCtx) -> Result<bool> {
        if self.done {
            return Ok(false);
        }
        let page = find(ds, ctx, &self.find).await?;
        for b in &page.items {
            self.seen += 1;
            *self.by_status.entry(b.status.clone()).or_default() += 1;
            *self.totals.entry(b.currency.clone()).or_default() += b.total_minor;
            if self.first.len() < 20 {
                self.first.push(b.handle.clone());
                if self.first.len() == 20 {
                    self.after_first = Some(encode_cursor(&[
                        &to_ts(b.starts_at).as_microsecond().to_string(),
                        &b.handle,
                    ]));
                }
            }
        }
        self.find.cursor = page.next_cursor.clone();
        self.done = page.next_cursor.is_none();
        Ok(!self.done)
    }

    pub fn finish(self, ctx: &OpCtx, now: jiff::Timestamp) -> ExportSummary {
        let tz = time::zone("zone", &self.zone).unwrap_or(ctx.tenant().zone.clone());
        let continue_with =
            self.after_first.filter(|_| self.seen > 20).map(|cursor| ContinueWith {
                from: self.find.from,
                to: self.find.to,
                zone: self.zone.clone(),
                status: self.find.status,
                cursor,
            });
        ExportSummary {
            from: time::present(self.from, &tz, &self.zone, now),
            to: time::present(self.to, &tz, &self.zone, now),
            count: self.seen,
            by_status: self
                .by_status
                .into_iter()
                .map(|(status, count)| StatusCount { status, count })
                .collect(),
            totals: self
                .totals
                .into_iter()
                .map(|(c, minor)| crate::money::present(minor, &c))
                .collect(),
            first: self.first,
            continue_with,
        }
    }
}
