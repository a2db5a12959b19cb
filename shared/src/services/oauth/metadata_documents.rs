//! Client ID metadata documents: a client named by an https URL whose JSON says who it is, fetched through the outbound-HTTP guard and cached.

use super::*;

/// Why an address may not be fetched: loopback, private, link-local (cloud metadata),
/// unspecified, multicast, unique-local, and every entry of [`ALWAYS_REFUSED`].
pub fn forbidden_ip(ip: IpAddr) -> bool {
    always_refused(ip).is_some()
        || match ip {
            IpAddr::V4(v4) => forbidden_v4(v4),
            IpAddr::V6(v6) => forbidden_v6(v6),
        }
}

/// An address range: `addr` with its first `len` bits significant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Net {
    addr: IpAddr,
    len: u8,
}

impl Net {
    const fn v4(o: [u8; 4], len: u8) -> Self {
        Net { addr: IpAddr::V4(Ipv4Addr::new(o[0], o[1], o[2], o[3])), len }
    }

    const fn v6(s: [u16; 8], len: u8) -> Self {
        Net { addr: IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7])), len }
    }

    fn contains(self, ip: IpAddr) -> bool {
        let (net, ip, width) = match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(i)) => {
                (u128::from(u32::from(n)), u128::from(u32::from(i)), 32)
            }
            (IpAddr::V6(n), IpAddr::V6(i)) => (u128::from(n), u128::from(i), 128),
            _ => return false,
        };
        // A shift of the whole width (a /0) compares nothing: `checked_shr` gives None to both.
        let shift = width - u32::from(self.len);
        net.checked_shr(shift) == ip.checked_shr(shift)
    }
}

impl std::fmt::Display for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// Never fetched, in development either: the link-local ranges and the instance metadata and
/// credential endpoints of the major clouds, some of which sit outside link-local (in private,
/// shared or unique-local space that development allows, or in public space). Each entry says
/// what it is, and a refusal names the entry that matched; the most specific entries come
/// first because the first match wins.
pub(super) const ALWAYS_REFUSED: &[(&str, Net)] = &[
    (
        "a cloud metadata address (AWS, GCP, Azure, OCI, OpenStack, DigitalOcean, Akamai…)",
        Net::v4([169, 254, 169, 254], 32),
    ),
    ("the AWS ECS task metadata and credentials address", Net::v4([169, 254, 170, 2], 32)),
    ("the AWS EKS Pod Identity credentials address", Net::v4([169, 254, 170, 23], 32)),
    ("the Tencent Cloud metadata address", Net::v4([169, 254, 0, 23], 32)),
    ("the Scaleway metadata address", Net::v4([169, 254, 42, 42], 32)),
    ("the Alibaba Cloud metadata address", Net::v4([100, 100, 100, 200], 32)),
    ("the Oracle Cloud legacy metadata address", Net::v4([192, 0, 0, 192], 32)),
    ("the Azure WireServer (host agent) address", Net::v4([168, 63, 129, 16], 32)),
    ("the AWS IPv6 instance metadata address", Net::v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254], 128)),
    (
        "the AWS EKS Pod Identity IPv6 credentials address",
        Net::v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23], 128),
    ),
    ("the GCP IPv6 metadata address", Net::v6([0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254], 128)),
    ("the OCI IPv6 metadata address", Net::v6([0xfd00, 0xc1, 0, 0, 0, 0, 0xa9fe, 0xa9fe], 128)),
    (
        "the Akamai (Linode) IPv6 metadata address",
        Net::v6([0xfd00, 0xa9fe, 0xa9fe, 0, 0, 0, 0, 1], 128),
    ),
    ("the Scaleway IPv6 metadata address", Net::v6([0xfd00, 0x42, 0, 0, 0, 0, 0, 0x42], 128)),
    ("the OpenStack IPv6 metadata address", Net::v6([0xfe80, 0, 0, 0, 0, 0, 0xa9fe, 0xa9fe], 128)),
    (
        "an IPv4 link-local address (169.254.0.0/16), where cloud metadata services answer",
        Net::v4([169, 254, 0, 0], 16),
    ),
    ("an IPv6 link-local address (fe80::/10)", Net::v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10)),
];

/// An address the guard refuses in every mode, and why.
#[derive(Debug)]
pub(super) struct AlwaysRefused {
    pub(super) ip: IpAddr,
    /// The IPv6 form and the IPv4 address inside it that matched, when the match is indirect.
    pub(super) via: Option<(&'static str, Ipv4Addr)>,
    pub(super) what: &'static str,
    pub(super) net: Net,
}

impl std::fmt::Display for AlwaysRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self { ip, via, what, net } = self;
        match via {
            None => write!(f, "{ip} is {what}, which is never fetched (refused range {net})"),
            Some((form, v4)) => write!(
                f,
                "{ip} carries {v4} ({form}), and {v4} is {what}, which is never fetched \
                 (refused range {net})"
            ),
        }
    }
}

/// The [`ALWAYS_REFUSED`] entry `ip` falls in, directly or through an IPv4 address it carries.
pub(super) fn always_refused(ip: IpAddr) -> Option<AlwaysRefused> {
    let entry = |ip: IpAddr| ALWAYS_REFUSED.iter().find(|(_, net)| net.contains(ip));
    if let Some(&(what, net)) = entry(ip) {
        return Some(AlwaysRefused { ip, via: None, what, net });
    }
    let IpAddr::V6(v6) = ip else { return None };
    embedded_v4(v6).into_iter().find_map(|(form, v4)| {
        entry(IpAddr::V4(v4)).map(|&(what, net)| AlwaysRefused {
            ip,
            via: Some((form, v4)),
            what,
            net,
        })
    })
}

/// The IPv4 addresses an IPv6 address carries, each with its form: a connection to it may end
/// at that IPv4 address (a dual-stack socket, a translator, a tunnel relay), so each is judged
/// like the IPv4 address itself. The local-use NAT64 prefix may be cut at any RFC 6052 length,
/// so every position it allows is read; Teredo names its server and, inverted, its client.
pub(super) fn embedded_v4(ip: Ipv6Addr) -> Vec<(&'static str, Ipv4Addr)> {
    let s = ip.segments();
    let o = ip.octets();
    let at = |i: [usize; 4]| Ipv4Addr::new(o[i[0]], o[i[1]], o[i[2]], o[i[3]]);
    let last = at([12, 13, 14, 15]);
    if s[..5] == [0; 5] && s[5] == 0xffff {
        vec![("IPv4-mapped", last)]
    } else if s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0 {
        vec![("IPv4-translated", last)]
    } else if s[..6] == [0; 6] {
        vec![("IPv4-compatible", last)]
    } else if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        vec![("NAT64", last)]
    } else if s[..3] == [0x64, 0xff9b, 1] {
        vec![
            ("local-use NAT64 /48", at([6, 7, 9, 10])),
            ("local-use NAT64 /56", at([7, 9, 10, 11])),
            ("local-use NAT64 /64", at([9, 10, 11, 12])),
            ("local-use NAT64 /96", last),
        ]
    } else if s[0] == 0x2002 {
        vec![("6to4", at([2, 3, 4, 5]))]
    } else if s[..2] == [0x2001, 0] {
        vec![
            ("Teredo client", Ipv4Addr::from(!u32::from(last))),
            ("Teredo server", at([4, 5, 6, 7])),
        ]
    } else {
        Vec::new()
    }
}

/// Why the guard refuses to connect to any of `addrs`, for the client's error description:
/// an [`ALWAYS_REFUSED`] entry in any mode (named first, whichever address it is), any other
/// forbidden address outside development. The generic refusal names no address, so the guard
/// never tells a client what an internal name resolves to.
pub(super) fn refusal(addrs: &[IpAddr], dev: bool) -> Option<String> {
    if let Some(hit) = addrs.iter().find_map(|a| always_refused(*a)) {
        return Some(hit.to_string());
    }
    (!dev && addrs.iter().any(|a| forbidden_ip(*a))).then(|| {
        "the host resolves to a private, loopback or link-local address, which is never fetched"
            .to_owned()
    })
}

/// The IANA IPv4 special-purpose registry's ranges that are not globally reachable, plus
/// multicast and the reserved block: none is ever fetched.
pub(super) fn forbidden_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    a == 0                                        // "this network" 0.0.0.0/8
        || a == 10                                // private 10/8
        || a == 127                               // loopback
        || (a == 100 && (64..128).contains(&b))   // shared address space 100.64/10
        || (a == 169 && b == 254)                 // link local (cloud metadata)
        || (a == 172 && (16..32).contains(&b))    // private 172.16/12
        || (a == 192 && b == 0 && c == 0)         // IETF protocol assignments 192.0.0/24
        || (a == 192 && b == 0 && c == 2)         // documentation TEST-NET-1
        || (a == 192 && b == 88 && c == 99)       // 6to4 relay anycast
        || (a == 192 && b == 168)                 // private 192.168/16
        || (a == 198 && (18..20).contains(&b))    // benchmarking 198.18/15
        || (a == 198 && b == 51 && c == 100)      // documentation TEST-NET-2
        || (a == 203 && b == 0 && c == 113)       // documentation TEST-NET-3
        || a >= 224 // multicast, reserved, broadcast
}

/// The IANA IPv6 special-purpose registry's non-global ranges, and every form that embeds an
/// IPv4 address (mapped, compatible, NAT64, 6to4, Teredo), judged by the address inside.
pub(super) fn forbidden_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    embedded_v4(ip).into_iter().any(|(_, v4)| forbidden_v4(v4))
        || ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        // IPv4-compatible ::a.b.c.d (deprecated) and IPv4-translated ::ffff:0:a.b.c.d: never fetched
        || (s[..6] == [0; 6])
        || (s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0)
        // NAT64 64:ff9b::/96 and the local-use 64:ff9b:1::/48: a translator reaches anything, never fetched
        || (s[0] == 0x64 && s[1] == 0xff9b)
        // Teredo 2001::/32, ORCHID and the IETF protocol block 2001::/23, documentation 2001:db8::/32
        || (s[0] == 0x2001 && s[1] < 0x0200)
        || (s[0] == 0x2001 && s[1] == 0x0db8)
        // documentation 3fff::/20
        || (s[0] & 0xfff0) == 0x3ff0
        // discard-only 100::/64
        || (s[0] == 0x0100 && s[1..4] == [0; 3])
        // unique local fc00::/7, link local fe80::/10, site local fec0::/10
        || (s[0] & 0xfe00) == 0xfc00
        || (s[0] & 0xffc0) == 0xfe80
        || (s[0] & 0xffc0) == 0xfec0
}

pub(super) const CIMD_MAX_BYTES: usize = 64 * 1024;
pub(super) const CIMD_CACHE_SECS: i64 = 3600;
/// The least time between two fetches of a client's key set for an unknown `kid`.
pub(super) const JWKS_REFRESH_SECS: i64 = 60;

/// How client metadata documents and key sets may be fetched. The default is production's:
/// https only, public addresses only, the system's web PKI roots.
#[derive(Clone, Debug, Default)]
pub struct FetchPolicy {
    /// Development on one machine: loopback and private addresses, and http, are allowed;
    /// link-local and cloud metadata addresses (the guard's always-refused table) never are.
    pub dev: bool,
    /// Extra trusted roots (a development or test CA), in addition to the web PKI roots.
    pub extra_roots: Vec<reqwest::Certificate>,
}

/// Fetches a small JSON document for the authorization server: https only (http too in
/// development), every resolved address public (unless in development), the connection
/// pinned to the checked address, never through a proxy, five seconds and 64 KiB at most, no
/// redirects. The error says why, for the client's `error_description`.
pub(crate) async fn guarded_fetch(
    url: &str,
    policy: &FetchPolicy,
) -> std::result::Result<Vec<u8>, String> {
    guarded(url, policy, Outbound::Get).await.map(|(_, body)| body)
}

/// POSTs a form behind the same guard as [`guarded_fetch`] (a tenant IdP's token endpoint),
/// with HTTP Basic client authentication when `basic` names a client id and secret. A JSON
/// answer is returned whatever its status: token endpoints explain refusals in the body.
pub(crate) async fn guarded_post(
    url: &str,
    policy: &FetchPolicy,
    form: &[(&str, &str)],
    basic: Option<(&str, &str)>,
) -> std::result::Result<(u16, Vec<u8>), String> {
    guarded(url, policy, Outbound::Post { form, basic }).await
}

/// POSTs a JSON body with extra headers behind the same guard (a tenant's audit webhook);
/// returns the status, whatever it is.
pub(crate) async fn guarded_post_json(
    url: &str,
    policy: &FetchPolicy,
    body: &[u8],
    headers: &[(&str, String)],
) -> std::result::Result<u16, String> {
    guarded(url, policy, Outbound::Json { body, headers }).await.map(|(status, _)| status)
}

/// Checks that a URL could be fetched behind the guard (scheme, host, addresses) without
/// fetching it: an endpoint named now and called later (an IdP's token endpoint).
pub(crate) async fn guarded_target(
    url: &str,
    policy: &FetchPolicy,
) -> std::result::Result<(), String> {
    guarded(url, policy, Outbound::CheckOnly).await.map(|_| ())
}

pub(super) enum Outbound<'a> {
    CheckOnly,
    Get,
    Post { form: &'a [(&'a str, &'a str)], basic: Option<(&'a str, &'a str)> },
    Json { body: &'a [u8], headers: &'a [(&'a str, String)] },
}

pub(super) async fn guarded(
    url: &str,
    policy: &FetchPolicy,
    how: Outbound<'_>,
) -> std::result::Result<(u16, Vec<u8>), String> {
    let parsed = url::Url::parse(url).map_err(|_| "not a URL".to_owned())?;
    if parsed.scheme() != "https" && !(policy.dev && parsed.scheme() == "http") {
        return Err("documents are fetched over https only".into());
    }
    let host = parsed.host_str().ok_or("no host")?.to_owned();
    if parsed.path().len() <= 1 {
        return Err("the URL has no path".into());
    }
    if !parsed.username().is_empty() || parsed.password().is_some() || parsed.fragment().is_some() {
        return Err("the URL carries user information or a fragment".into());
    }
    let port = parsed.port_or_known_default().unwrap_or(443);
    let addrs: Vec<SocketAddr> = tokio::time::timeout(
        Duration::from_secs(3),
        tokio::net::lookup_host((host.trim_matches(['[', ']']), port)),
    )
    .await
    .map_err(|_| "DNS lookup timed out".to_owned())?
    .map_err(|_| "the host does not resolve".to_owned())?
    .collect();
    if addrs.is_empty() {
        return Err("the host does not resolve".into());
    }
    // Development lets loopback and private addresses through, never link-local or cloud
    // metadata ones in any form (no development server lives there).
    let ips: Vec<IpAddr> = addrs.iter().map(SocketAddr::ip).collect();
    if let Some(why) = refusal(&ips, policy.dev) {
        return Err(why);
    }
    let mut builder = reqwest::Client::builder()
        // Never through a proxy: the address checked is the address connected to.
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(5))
        .resolve(&host, addrs[0]);
    for root in &policy.extra_roots {
        builder = builder.add_root_certificate(root.clone());
    }
    let client = builder.build().map_err(|_| "cannot build the HTTP client".to_owned())?;
    let (request, any_status) = match how {
        Outbound::CheckOnly => return Ok((0, Vec::new())),
        Outbound::Get => (client.get(parsed), false),
        Outbound::Post { form, basic } => {
            let mut request = client.post(parsed).form(form);
            if let Some((id, secret)) = basic {
                // RFC 6749 §2.3.1: each part form-urlencoded before the Basic encoding.
                let enc = |s: &str| {
                    url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>()
                };
                request = request.basic_auth(enc(id), Some(enc(secret)));
            }
            (request, true)
        }
        Outbound::Json { body, headers } => {
            let mut request = client
                .post(parsed)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_vec());
            for (name, value) in headers {
                request = request.header(*name, value.as_str());
            }
            (request, true)
        }
    };
    let mut response =
        request.header(reqwest::header::ACCEPT, "application/json").send().await.map_err(|e| {
            tracing::warn!(error = ?e, url = %url, "outbound fetch failed");
            "fetching it failed".to_owned()
        })?;
    if !any_status && !response.status().is_success() {
        return Err(format!("fetching it answered {}", response.status()));
    }
    let status = response.status().as_u16();
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|_| "reading it failed".to_owned())? {
        body.extend_from_slice(&chunk);
        if body.len() > CIMD_MAX_BYTES {
            return Err("it is larger than 64 KiB".into());
        }
    }
    Ok((status, body))
}

/// Fetches a client ID metadata document behind the SSRF guard; results are cached for an hour.
pub(super) async fn fetch_metadata_document(
    svc: &Services,
    url: &str,
    policy: &FetchPolicy,
) -> std::result::Result<ClientRow, OAuthError> {
    if let Some(client) = svc.preauth_oauth_client_get(url).await.map_err(OAuthError::from)?
        && client
            .fetched_at
            .is_some_and(|t| (chrono::Utc::now() - t).num_seconds() < CIMD_CACHE_SECS)
    {
        return Ok(client);
    }
    let invalid = |why: &str| OAuthError {
        error: "invalid_client",
        error_description: format!("client_id {url}: {why}"),
    };
    let body = guarded_fetch(url, policy).await.map_err(|why| invalid(&why))?;
    let doc: MetadataDocument = serde_json::from_slice(&body)
        .map_err(|_| invalid("the document is not client metadata JSON"))?;
    accept_metadata_document(svc, url, doc).await
}

/// Resolves the `client_id` of an authorization request: a registered client, or a client ID
/// metadata document fetched behind the SSRF guard.
pub async fn resolve_client(
    svc: &Services,
    client_id: &str,
    policy: &FetchPolicy,
) -> std::result::Result<ClientRow, OAuthError> {
    if client_id.starts_with("https://") || client_id.starts_with("http://") {
        return fetch_metadata_document(svc, client_id, policy).await;
    }
    svc.preauth_oauth_client_get(client_id).await.map_err(OAuthError::from)?.ok_or(OAuthError {
        error: "invalid_client",
        error_description: "unknown client_id; register first".into(),
    })
}
