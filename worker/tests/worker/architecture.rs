//! The layers hold (R2, R5): tool code never touches persistence or an ambient user, and a
//! context without an actor fails closed.

#[test]
fn tool_code_never_touches_persistence_or_an_ambient_user() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/tools");
    let forbidden = [
        "sqlx",
        "PgPool",
        "Pool<",
        ".pool(",
        "query(",
        "query_as",
        "raw_sql",
        "current_user",
        "CurrentUser",
        "testing::",
    ];
    let mut scanned = 0;
    for entry in std::fs::read_dir(&dir).expect("tools dir") {
        let path = entry.expect("entry").path();
        let source = std::fs::read_to_string(&path).expect("read");
        scanned += 1;
        for word in forbidden {
            assert!(
                !source.contains(word),
                "{} uses `{word}`: tools call services, never persistence (R2, R5)",
                path.display()
            );
        }
    }
    assert!(scanned >= 2, "the scan saw the tool modules");
}

#[test]
fn a_context_without_an_actor_fails_closed() {
    let tenant = shared::ctx::TenantRef {
        id: 1,
        handle: shared::handle::TenantHandle::generate(),
        slug: "x".into(),
        zone: jiff::tz::TimeZone::UTC,
        zone_name: "UTC".into(),
        currency: "EUR".into(),
    };
    let ctx = shared::OpCtx::pre_auth(tenant, shared::ctx::Channel::Mcp);
    for right in shared::rights::Right::ALL {
        assert!(matches!(ctx.require(*right), Err(shared::Error::NoActor)));
    }
}
