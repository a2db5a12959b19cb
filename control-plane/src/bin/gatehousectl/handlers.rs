//! The longer command families: the tenant's identity provider and the audit log (verify,
//! export, keys, the SIEM webhook).

use super::*;

pub(super) async fn idp(
    ds: &Services,
    operator: &Operator,
    cmd: IdpCmd,
) -> shared::Result<(Value, String)> {
    use shared::services::{id_jag, sso};
    let slug = match &cmd {
        IdpCmd::Set { t, .. }
        | IdpCmd::Show { t }
        | IdpCmd::Remove { t }
        | IdpCmd::ClientAdd { t, .. }
        | IdpCmd::Clients { t } => t.tenant.clone(),
    };
    let ctx = in_tenant(ds, Some(operator), &slug).await?;
    let describe = |i: &sso::IdpView| {
        format!(
            "issuer {}\nclient id {} ({})\nemail domains {}\njoin as viewer {}\nsso required {}\nid-jag {}\nsession hours {}",
            i.issuer,
            i.client_id,
            i.token_auth_method,
            i.email_domains.join(","),
            if i.allow_join { "on" } else { "off" },
            if i.sso_required { "on" } else { "off" },
            if i.id_jag { "on" } else { "off" },
            i.session_hours
        )
    };
    match cmd {
        IdpCmd::Set {
            issuer,
            client_id,
            client_secret,
            email_domains,
            allow_join,
            sso_required,
            id_jag,
            session_hours,
            dev_mode,
            ..
        } => {
            let policy =
                shared::services::oauth::FetchPolicy { dev: dev_mode, ..Default::default() };
            let input = sso::IdpInput {
                issuer,
                client_id,
                client_secret,
                email_domains,
                allow_join: allow_join == "on",
                sso_required: sso_required == "on",
                id_jag: id_jag == "on",
                session_hours,
            };
            let v = sso::idp_set(ds, &ctx, &policy, input).await?;
            let text = format!("identity provider of {slug} set\n{}", describe(&v));
            Ok((json!({"tenant": slug, "idp": v}), text))
        }
        IdpCmd::Show { .. } => {
            let v = sso::idp_show(ds, &ctx).await?;
            let text = match &v {
                Some(v) => describe(v),
                None => format!("{slug} has no identity provider; people sign in with passwords"),
            };
            Ok((json!({"tenant": slug, "idp": v}), text))
        }
        IdpCmd::Remove { .. } => {
            let removed = sso::idp_remove(ds, &ctx).await?;
            let text = if removed {
                format!("identity provider of {slug} removed; its sessions ended")
            } else {
                format!("{slug} had no identity provider")
            };
            Ok((json!({"tenant": slug, "removed": removed}), text))
        }
        IdpCmd::ClientAdd { name, .. } => {
            let r = id_jag::client_register(ds, &ctx, &name).await?;
            let text = format!(
                "registered {} for {slug}\nclient id     {}\nclient secret {} (shown once)",
                r.name, r.client_id, r.client_secret
            );
            Ok((to_json(&r), text))
        }
        IdpCmd::Clients { .. } => {
            let list = id_jag::client_list(ds, &ctx).await?;
            let text = list
                .iter()
                .map(|c| format!("{}  {}  {}", c.client_id, c.name, c.created_at))
                .collect::<Vec<_>>()
                .join("\n");
            Ok((json!({"clients": list}), if text.is_empty() { "no clients".into() } else { text }))
        }
    }
}

pub(super) fn to_json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or_default()
}

/// Reads the published key set from a URL or a file.
pub(super) async fn key_set(
    source: &str,
) -> shared::Result<Vec<shared::services::audit::PublicKey>> {
    let text = if source.starts_with("http://") || source.starts_with("https://") {
        let fail = |e: String| Error::invalid("keys", format!("{source}: {e}"));
        let response = reqwest::Client::new()
            .get(source)
            .timeout(std::time::Duration::from_secs(10))
            .send()
            .await
            .map_err(|e| fail(format!("could not be fetched ({e})")))?;
        if !response.status().is_success() {
            return Err(fail(format!("answered {}", response.status())));
        }
        response.text().await.map_err(|e| fail(e.to_string()))?
    } else {
        std::fs::read_to_string(source)
            .map_err(|e| Error::invalid("keys", format!("{source} cannot be read: {e}")))?
    };
    shared::services::audit::PublicKey::parse_set(&text)
        .map_err(|e| Error::invalid("keys", format!("{source}: {e}")))
}

pub(super) async fn audit(
    ds: &Services,
    common: &Common,
    operator: Option<&Operator>,
    cmd: AuditCmd,
) -> shared::Result<(Value, String)> {
    use shared::services::audit;
    match cmd {
        AuditCmd::Keys => {
            let keys = audit::public_keys(ds);
            let text = keys
                .iter()
                .map(|k| {
                    let status = serde_json::to_value(k.status).unwrap_or_default();
                    format!(
                        "{}  Ed25519  {}  {}",
                        k.kid,
                        k.public_key,
                        status.as_str().unwrap_or("")
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            let text = if text.is_empty() {
                "GATEHOUSE_AUDIT_SIGNING_KEYS is not set".into()
            } else {
                text
            };
            Ok((json!({"alg": "Ed25519", "keys": keys}), text))
        }
        AuditCmd::WebhookSchema => {
            let schema = audit::event_schema();
            let text = serde_json::to_string_pretty(&schema).unwrap_or_default();
            Ok((schema, text))
        }
        AuditCmd::Checkpoint => {
            need_operator(operator)?;
            let mut anchors = common.audit_anchors()?;
            let chained = audit::chain_round(ds).await?;
            let round = audit::checkpoint_round(ds, &mut anchors).await?;
            let mut text =
                format!("{chained} row(s) chained, {} checkpoint(s) signed", round.signed.len());
            for r in &round.refused {
                text.push_str(&format!("\nREFUSED {}: {}", r.tenant, r.reason));
            }
            if let Some(e) = &round.file_error {
                text.push_str(&format!("\nwarning: {e}"));
            }
            Ok((
                json!({
                    "chained": chained,
                    "checkpoints": round.signed.len(),
                    "signed": round.signed,
                    "refused": round.refused,
                    "anchor_file_error": round.file_error,
                }),
                text,
            ))
        }
        AuditCmd::Verify {
            t,
            keys,
            public_keys,
            anchor_files,
            anchors,
            strict,
            checkpoint_secs,
        } => {
            let ctx = in_tenant(ds, operator, &t.tenant).await?;
            let mut with = audit::VerifyWith {
                keys: public_keys
                    .iter()
                    .map(|k| {
                        audit::PublicKey::parse(k).map_err(|e| Error::invalid("public-key", e))
                    })
                    .collect::<shared::Result<Vec<_>>>()?,
                anchors: anchors
                    .iter()
                    .map(|a| audit::Anchor::parse_head(a).map_err(|e| Error::invalid("anchor", e)))
                    .collect::<shared::Result<Vec<_>>>()?,
                unanchored_after_secs: 2 * checkpoint_secs.max(1),
            };
            if let Some(source) = &keys {
                with.keys.extend(key_set(source).await?);
            }
            for path in &anchor_files {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    Error::invalid("anchors", format!("{} cannot be read: {e}", path.display()))
                })?;
                let found = audit::parse_anchors(&text)
                    .map_err(|e| Error::invalid("anchors", format!("{}: {e}", path.display())))?;
                with.anchors.extend(found.into_iter().map(audit::Anchor::Signed));
            }
            let v = audit::verify(ds, &ctx, &with).await?;
            let mut text = match &v.problem {
                None => format!(
                    "{}: verified {} row(s){}{}",
                    t.tenant,
                    v.rows_checked,
                    v.last_seq.map(|s| format!(" up to row {s}")).unwrap_or_default(),
                    v.verified_until
                        .as_deref()
                        .map(|at| format!(" (written {at})"))
                        .unwrap_or_default()
                ),
                Some(p) => format!(
                    "{}: TAMPERED ({}) at {}: {}",
                    t.tenant,
                    serde_json::to_value(p.kind)
                        .ok()
                        .and_then(|k| k.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    p.seq
                        .map(|s| format!("row {s}"))
                        .or(p.audit_id.map(|i| format!("audit id {i}")))
                        .unwrap_or_default(),
                    p.detail
                ),
            };
            if let Some(c) = &v.last_checkpoint {
                text.push_str(&format!(
                    "\n{} checkpoint(s); the last at row {} signed {} by {}",
                    v.checkpoints_checked, c.seq, c.signed_at, c.kid
                ));
            }
            if v.anchors_checked > 0 {
                text.push_str(&format!("\n{} anchor(s) held outside checked", v.anchors_checked));
            } else {
                text.push_str("\nno anchors given: a deleted tail or a rewrite since the last checkpoint in the database is found only with --anchors (what your SIEM received)");
            }
            if v.pending > 0 {
                text.push_str(&format!("\n{} row(s) not chained yet", v.pending));
            }
            if let Some(u) = &v.unanchored {
                text.push_str(&format!(
                    "\nUNANCHORED: {} row(s) from row {} (chained since {}) are covered by no checkpoint{}",
                    u.rows,
                    u.from_seq,
                    u.oldest_chained_at,
                    if strict { "" } else { " (--strict fails on this)" }
                ));
            }
            let strict_failed = strict && v.unanchored.is_some();
            Ok((
                json!({"tenant": t.tenant, "verification": v, "strict_failed": strict_failed}),
                text,
            ))
        }
        AuditCmd::Prune { t, before } => {
            let before = admin::audit_instant("before", &before, false)?;
            let ctx = in_tenant(ds, operator, &t.tenant).await?;
            let p = audit::prune(ds, &ctx, before).await?;
            let text = format!(
                "{}: {} audit rows removed, through row {} (the checkpoint signed {} anchors the rest)",
                t.tenant, p.rows_removed, p.through_seq, p.checkpoint_signed_at
            );
            Ok((json!({"pruned": p}), text))
        }
        AuditCmd::Webhook(cmd) => {
            let slug = match &cmd {
                AuditWebhookCmd::Set { t, .. }
                | AuditWebhookCmd::Show { t }
                | AuditWebhookCmd::Rotate { t }
                | AuditWebhookCmd::Remove { t } => t.tenant.clone(),
            };
            let ctx = in_tenant(ds, operator, &slug).await?;
            match cmd {
                AuditWebhookCmd::Set { url, dev, .. } => {
                    let policy = shared::services::oauth::FetchPolicy { dev, ..Default::default() };
                    let (hook, secret) = audit::webhook_set(ds, &ctx, &url, &policy).await?;
                    let text = match &secret {
                        Some(s) => format!(
                            "{slug}: audit events go to {}\nsecret (shown once): {s}",
                            hook.url
                        ),
                        None => {
                            format!("{slug}: audit events go to {} (secret unchanged)", hook.url)
                        }
                    };
                    Ok((json!({"webhook": hook, "secret": secret}), text))
                }
                AuditWebhookCmd::Show { .. } => {
                    let hook = audit::webhook_show(ds, &ctx).await?;
                    let text = match &hook {
                        None => format!("{slug}: no audit webhook"),
                        Some(h) => format!(
                            "{slug}: {}  delivered up to row {}, {} waiting{}{}",
                            h.url,
                            h.delivered_seq,
                            h.backlog,
                            h.last_error
                                .as_deref()
                                .map(|e| format!(", last error: {e}"))
                                .unwrap_or_default(),
                            h.dropped_note.as_deref().map(|n| format!("\n{n}")).unwrap_or_default()
                        ),
                    };
                    Ok((json!({"webhook": hook}), text))
                }
                AuditWebhookCmd::Rotate { .. } => {
                    let r = audit::webhook_rotate(ds, &ctx).await?;
                    let text = format!(
                        "{slug}: new secret (shown once): {}\nthe previous one keeps signing beside it for a day",
                        r.secret
                    );
                    Ok((json!({"webhook": r.webhook, "secret": r.secret}), text))
                }
                AuditWebhookCmd::Remove { .. } => {
                    let removed = audit::webhook_remove(ds, &ctx).await?;
                    Ok((
                        json!({"removed": removed}),
                        if removed {
                            format!("{slug}: audit webhook removed")
                        } else {
                            format!("{slug}: no audit webhook")
                        },
                    ))
                }
            }
        }
    }
}

/// Reads a policy file, with a clear error when it cannot.
pub(super) fn policy_file(path: &std::path::Path) -> shared::Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| Error::invalid("file", format!("cannot read {}: {e}", path.display())))
}

pub(super) async fn policy(
    ds: &Services,
    operator: Option<&Operator>,
    cmd: PolicyCmd,
) -> shared::Result<(Value, String)> {
    use shared::services::policies;
    if let PolicyCmd::Check { file } = &cmd {
        let source = policy_file(file)?;
        return match policies::check(&source) {
            Ok(found) => {
                let text = format!(
                    "{} polic{} check against the schema:\n{}",
                    found.len(),
                    if found.len() == 1 { "y" } else { "ies" },
                    found
                        .iter()
                        .map(|p| format!(
                            "  {}{}: {}",
                            p.id,
                            if p.approval { " (@approval)" } else { "" },
                            p.reason
                        ))
                        .collect::<Vec<_>>()
                        .join("\n")
                );
                Ok((json!({"ok": true, "policies": found}), text))
            }
            Err(problems) => Err(Error::invalid(
                "policy",
                problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
            )),
        };
    }
    let slug = match &cmd {
        PolicyCmd::Show { t }
        | PolicyCmd::Simulate { t, .. }
        | PolicyCmd::Set { t, .. }
        | PolicyCmd::History { t, .. } => t.tenant.clone(),
        PolicyCmd::Check { .. } => unreachable!("answered above"),
    };
    let ctx = in_tenant(ds, operator, &slug).await?;
    match cmd {
        PolicyCmd::Show { .. } => {
            let view = policies::show(ds, &ctx).await?;
            let text = if view.version == 0 {
                "No policy set: agents may do what their rights allow.".to_owned()
            } else {
                format!(
                    "Version {} (set by {} at {}{}):\n{}\n\n{}",
                    view.version,
                    view.author.as_deref().unwrap_or("?"),
                    view.set_at.as_deref().unwrap_or("?"),
                    view.note
                        .as_deref()
                        .filter(|n| !n.is_empty())
                        .map(|n| format!(": {n}"))
                        .unwrap_or_default(),
                    view.policies
                        .iter()
                        .map(|p| format!(
                            "  {}{}: {}",
                            p.id,
                            if p.approval { " (@approval)" } else { "" },
                            p.reason
                        ))
                        .collect::<Vec<_>>()
                        .join("\n"),
                    view.source.trim_end()
                )
            };
            Ok((to_json(&view), text))
        }
        PolicyCmd::Simulate { file, hours, .. } => {
            let source = policy_file(&file)?;
            let sim = policies::simulate(ds, &ctx, &source, hours).await?;
            let mut text = format!(
                "{} calls of the last {hours} h: {} allowed, {} forbidden, {} to a person, {} not evaluated.",
                sim.calls, sim.allowed, sim.forbidden, sim.to_a_person, sim.errors
            );
            for c in &sim.by_policy {
                text.push_str(&format!(
                    "\n  {}: {} forbidden, {} to a person",
                    c.policy, c.forbidden, c.to_a_person
                ));
            }
            for e in &sim.examples {
                text.push_str(&format!(
                    "\n    {} {} by {} at {} ({})",
                    e.verdict, e.tool, e.connection, e.at, e.policy
                ));
            }
            text.push_str(&format!("\n{}", sim.caveat));
            Ok((to_json(&sim), text))
        }
        PolicyCmd::Set { file, expect_version, note, .. } => {
            let source = policy_file(&file)?;
            let done = policies::set(ds, &ctx, &source, expect_version, &note).await?;
            let text = format!(
                "Version {} is in force ({} polic{}; it {} what agents may do).",
                done.version,
                done.policies.len(),
                if done.policies.len() == 1 { "y" } else { "ies" },
                if done.widens { "may widen" } else { "only narrows" }
            );
            Ok((to_json(&done), text))
        }
        PolicyCmd::History { limit, .. } => {
            let versions = policies::history(ds, &ctx, limit).await?;
            let text = versions
                .iter()
                .map(|v| {
                    format!(
                        "version {} by {} at {}{}: +{} -{} lines",
                        v.version,
                        v.author,
                        v.set_at,
                        if v.note.is_empty() { String::new() } else { format!(" ({})", v.note) },
                        v.added.len(),
                        v.removed.len()
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            Ok((
                json!({"versions": versions}),
                if text.is_empty() { "No versions yet.".into() } else { text },
            ))
        }
        PolicyCmd::Check { .. } => unreachable!("answered above"),
    }
}
