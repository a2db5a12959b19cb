// The official TypeScript MCP client SDK (@modelcontextprotocol/client 2.x, protocol 2026-07-28)
// completes its own OAuth flow against Gatehouse, with nothing but the MCP URL:
//   1. discovery from the worker's 401 (RFC 9728 protected resource metadata, RFC 8414 AS metadata),
//   2. client registration: dynamic (RFC 7591) or, with --cimd, a client ID metadata document this
//      script serves itself over https on loopback,
//   3. sign-in and consent in Debian's Chromium (playwright-core), back to a loopback callback,
//   4. code exchange (PKCE, RFC 8707 resource, RFC 9207 iss), tools/list and a read tool,
//   5. refresh: once because the provider reports its access token expired, once because the
//      access token was revoked at the authorization server (RFC 7009) and the worker answers 401.
//
// Usage:
//   node oauth-flow.mjs --mcp URL --email E --password P --shots DIR [--cimd --cert PEM --key PEM [--cimd-port N]]
// --cimd-port fixes the document's port (a random free one otherwise); the authorization server
// may then answer from its one-hour cache of the document instead of fetching it again.
// Prints one JSON line; exits non-zero with a message (and a screenshot when the browser was
// open, plus the HTTP trail) on any failure. Needs Node 22 (`node --version`), Chromium at
// $CHROMIUM or /usr/bin/chromium, and `npm ci` in this folder.
//
// --cimd: the control plane must run with `--dev-mode --dev-ca-cert CA.pem` and trust the
// certificate served here. Use a CA and a leaf it signs (CA:FALSE, SAN IP:127.0.0.1): rustls
// refuses a self-signed CA:TRUE certificate as a server certificate (CaUsedAsEndEntity), which
// is what a bare `openssl req -x509` makes.
//   openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
//     -subj "/CN=test CA" -addext basicConstraints=critical,CA:TRUE \
//     -addext keyUsage=critical,keyCertSign -keyout ca-key.pem -out ca.pem
//   openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=localhost \
//     -keyout key.pem -out leaf.csr
//   printf 'basicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n' > leaf.ext
//   openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 2 \
//     -extfile leaf.ext -out cert.pem
import {
  CLIENT_CAPABILITIES_META_KEY,
  CLIENT_INFO_META_KEY,
  Client,
  PROTOCOL_VERSION_META_KEY,
  StreamableHTTPClientTransport,
  UnauthorizedError,
} from "@modelcontextprotocol/client";
import { chromium } from "playwright-core";
import { randomBytes } from "node:crypto";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createServer as createHttpServer } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import { join } from "node:path";

const PROTOCOL = "2026-07-28";

// ---------------------------------------------------------------- arguments

const FLAGS = new Set(["cimd", "verbose"]);
const args = {};
for (let i = 2; i < process.argv.length; i++) {
  const name = process.argv[i].replace(/^--/, "");
  if (FLAGS.has(name)) args[name] = true;
  else args[name] = process.argv[++i];
}
const usage =
  "usage: node oauth-flow.mjs --mcp URL --email E --password P --shots DIR [--cimd --cert PEM --key PEM [--cimd-port N]] [--verbose]";
for (const required of ["mcp", "email", "password"]) {
  if (!args[required]) {
    console.error(`missing --${required}\n${usage}`);
    process.exit(2);
  }
}
if (args.cimd && !(args.cert && args.key)) {
  console.error(`--cimd needs --cert PEM and --key PEM (the metadata document is served over https)\n${usage}`);
  process.exit(2);
}
const mode = args.cimd ? "cimd" : "dcr";
const shots = args.shots ?? "screenshots";
mkdirSync(shots, { recursive: true });
const mcpUrl = new URL(args.mcp);

// ---------------------------------------------------------------- failure reporting

let step = "start";
let page;
let browser;
const trail = []; // every HTTP exchange the SDK made: what a bug report needs
const log = (...m) => args.verbose && console.error(...m);

class Failure extends Error {}
function expect(condition, message) {
  if (!condition) throw new Failure(`${step}: ${message}`);
}

function describe(error) {
  const parts = [error?.stack ?? String(error)];
  for (let e = error?.cause; e; e = e.cause) parts.push(`caused by: ${e?.stack ?? e}`);
  if (error?.data) parts.push(`data: ${JSON.stringify(error.data)}`);
  return parts.join("\n");
}

async function fail(error) {
  const name = `${mode}-failure-${step.replace(/\W+/g, "-")}`;
  let shot = "(no browser page open)";
  if (page) {
    shot = join(shots, `${name}.png`);
    await page.screenshot({ path: shot, fullPage: true }).catch(() => (shot = "(screenshot failed)"));
  }
  const trailFile = join(shots, `${name}.http.txt`);
  writeFileSync(trailFile, trail.map((t) => JSON.stringify(t)).join("\n") + "\n");
  const message = error instanceof Failure ? error.message : `${step}: ${describe(error)}`;
  console.error(
    `FAILED (${mode}) ${message}\nscreenshot: ${shot}\nHTTP trail: ${trailFile}` +
      (page ? `\nbrowser url: ${page.url()}` : "") +
      `\nlast HTTP exchanges:\n${trail
        .slice(-6)
        .map((t) => `  ${t.method} ${t.url} -> ${t.status}${t.body ? ` ${t.body}` : ""}`)
        .join("\n")}`,
  );
  await browser?.close().catch(() => {});
  process.exit(1);
}

// A fetch that keeps the trail; the SDK uses it for the MCP requests and for every OAuth request.
async function tracingFetch(input, init) {
  const url = String(input instanceof Request ? input.url : input);
  const method = init?.method ?? (input instanceof Request ? input.method : "GET");
  const entry = { step, method, url };
  trail.push(entry);
  try {
    const response = await fetch(input, init);
    entry.status = response.status;
    const www = response.headers.get("www-authenticate");
    if (www) entry.www_authenticate = www;
    const ct = response.headers.get("content-type") ?? "";
    if (!response.ok || url.includes("/.well-known/") || url.includes("/oauth/")) {
      // Keep the body of errors and of OAuth answers (tokens redacted).
      const text = await response.clone().text().catch(() => "");
      entry.body = text.replace(/gh_mcp_[A-Za-z0-9_-]+/g, "gh_mcp_…").slice(0, 1500);
    }
    entry.content_type = ct;
    log(`${method} ${url} -> ${response.status}`);
    return response;
  } catch (error) {
    entry.error = String(error);
    throw error;
  }
}

// ---------------------------------------------------------------- loopback servers

function listen(server, port = 0, host = "127.0.0.1") {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve(server.address().port));
  });
}

// The redirect target: captures the authorization response.
let deliverCallback;
const callbackArrived = new Promise((resolve) => (deliverCallback = resolve));
const callbackServer = createHttpServer((req, res) => {
  const url = new URL(req.url, "http://127.0.0.1");
  if (url.pathname !== "/callback") {
    res.writeHead(404).end();
    return;
  }
  res.writeHead(200, { "content-type": "text/html; charset=utf-8" });
  res.end("<!doctype html><title>Done</title><h1>Authorization complete</h1><p>You can close this window.</p>");
  deliverCallback(url.searchParams);
});
const callbackPort = await listen(callbackServer);
const redirectUrl = `http://127.0.0.1:${callbackPort}/callback`;

// The client ID metadata document, served over https on loopback (--cimd).
let clientMetadataUrl;
let documentFetches = [];
let metadataServer;
// A published document cannot know the port a native client picks per run: it lists the
// loopback callback without a port, which RFC 8252 §7.3 says matches any port.
const documentRedirect = "http://127.0.0.1/callback";
if (args.cimd) {
  metadataServer = createHttpsServer({ cert: readFileSync(args.cert), key: readFileSync(args.key) }, (req, res) => {
    documentFetches.push({ path: req.url, method: req.method, accept: req.headers.accept ?? null });
    if (req.method !== "GET" || req.url !== "/client.json") {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { "content-type": "application/json", "cache-control": "max-age=3600" });
    res.end(
      JSON.stringify({
        client_id: clientMetadataUrl,
        client_name: "Gatehouse TS SDK e2e (cimd)",
        client_uri: new URL("/", clientMetadataUrl).href,
        redirect_uris: [documentRedirect],
        grant_types: ["authorization_code", "refresh_token"],
        response_types: ["code"],
        token_endpoint_auth_method: "none",
        application_type: "native",
      }),
    );
  });
  // A fetcher that does not trust the certificate shows up here, not as a request.
  metadataServer.on("tlsClientError", (error) => documentFetches.push({ tls_error: error.code ?? error.message }));
  const port = await listen(metadataServer, Number(args["cimd-port"] ?? 0));
  clientMetadataUrl = `https://127.0.0.1:${port}/client.json`;
}

// ---------------------------------------------------------------- the SDK's OAuth client provider

/** An in-memory OAuthClientProvider, as a CLI host would write one. */
class Provider {
  constructor() {
    this._state = randomBytes(16).toString("base64url");
    this.authorizationUrl = undefined;
    this.saved = []; // every token set saveTokens received, in order
    this.expired = false;
    if (clientMetadataUrl) this.clientMetadataUrl = clientMetadataUrl;
  }
  get redirectUrl() {
    return redirectUrl;
  }
  get clientMetadata() {
    return {
      client_name: `Gatehouse TS SDK e2e (${mode})`,
      redirect_uris: [redirectUrl],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      token_endpoint_auth_method: "none",
    };
  }
  state() {
    return this._state;
  }
  clientInformation() {
    return this._client;
  }
  saveClientInformation(info) {
    this._client = info;
  }
  /** The current tokens; once reported expired, the access token is withheld (as a host that
   *  tracks `expires_in` does), so the next request goes out without one and the SDK refreshes. */
  tokens() {
    if (!this._tokens) return undefined;
    if (this.expired) {
      const { access_token, ...rest } = this._tokens;
      return rest;
    }
    return this._tokens;
  }
  saveTokens(tokens) {
    this._tokens = tokens;
    this.saved.push(tokens);
    this.expired = false;
  }
  redirectToAuthorization(url) {
    this.authorizationUrl = url;
  }
  saveCodeVerifier(v) {
    this._verifier = v;
  }
  codeVerifier() {
    return this._verifier;
  }
  saveDiscoveryState(s) {
    this._discovery = s;
  }
  discoveryState() {
    return this._discovery;
  }
  invalidateCredentials(scope) {
    log(`SDK invalidates credentials: ${scope}`);
    this.invalidated = [...(this.invalidated ?? []), scope];
    if (scope === "all" || scope === "client") this._client = undefined;
    if (scope === "all" || scope === "tokens") this._tokens = undefined;
    if (scope === "all" || scope === "verifier") this._verifier = undefined;
    if (scope === "all" || scope === "discovery") this._discovery = undefined;
  }
}

function newClient(provider) {
  const client = new Client(
    { name: "gatehouse-ts-oauth-e2e", version: "1.0.0" },
    { versionNegotiation: { mode: { pin: PROTOCOL } } },
  );
  const transport = new StreamableHTTPClientTransport(mcpUrl, { authProvider: provider, fetch: tracingFetch });
  return { client, transport };
}

function isUnauthorized(error) {
  for (let e = error; e; e = e.cause) if (e instanceof UnauthorizedError) return true;
  return false;
}

function firstText(result) {
  return (result.content ?? []).find((c) => c.type === "text")?.text ?? "";
}

/** A raw tools/list with a given bearer token: the status the worker answers. */
async function statusWith(token) {
  const response = await fetch(mcpUrl, {
    method: "POST",
    headers: {
      authorization: `Bearer ${token}`,
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      "mcp-protocol-version": PROTOCOL,
      "mcp-method": "tools/list",
    },
    body: JSON.stringify({
      jsonrpc: "2.0",
      id: 1,
      method: "tools/list",
      params: {
        _meta: {
          [PROTOCOL_VERSION_META_KEY]: PROTOCOL,
          [CLIENT_INFO_META_KEY]: { name: "raw-check", version: "1" },
          [CLIENT_CAPABILITIES_META_KEY]: {},
        },
      },
    }),
  });
  await response.text().catch(() => "");
  return response.status;
}

// ---------------------------------------------------------------- the flow

const out = { mode };
try {
  const provider = new Provider();

  step = "connect without a token";
  {
    const { client, transport } = newClient(provider);
    let error;
    try {
      await client.connect(transport);
    } catch (e) {
      error = e;
    }
    expect(error !== undefined, "the MCP URL answered without a token; expected 401");
    if (!isUnauthorized(error) || !provider.authorizationUrl) throw error;
    await client.close().catch(() => {});
  }
  const discovery = provider.discoveryState();
  expect(discovery?.resourceMetadataUrl, "the SDK found resource_metadata in the 401's WWW-Authenticate");
  expect(discovery.resourceMetadata?.resource, "the SDK read the protected resource metadata");
  const asMeta = discovery.authorizationServerMetadata;
  expect(asMeta?.issuer, "the SDK read the authorization server metadata");
  out.issuer = asMeta.issuer;
  const www = trail.find((t) => t.status === 401 && t.www_authenticate)?.www_authenticate ?? "";
  expect(www.startsWith("Bearer ") && www.includes("resource_metadata="), `a Bearer challenge with resource_metadata: ${www}`);

  step = "registration";
  const clientId = provider.clientInformation()?.client_id;
  expect(clientId, "the SDK has a client_id");
  out.client_id = clientId;
  if (mode === "cimd") {
    expect(asMeta.client_id_metadata_document_supported === true, "the AS advertises client_id_metadata_document_supported");
    expect(clientId === clientMetadataUrl, `the client_id is the metadata document URL (${clientId})`);
    expect(!trail.some((t) => t.url === asMeta.registration_endpoint), "no dynamic registration in CIMD mode");
  } else {
    expect(
      trail.some((t) => t.url === asMeta.registration_endpoint && t.status === 201),
      "dynamic registration answered 201",
    );
  }
  const authUrl = provider.authorizationUrl;
  expect(authUrl.searchParams.get("client_id") === clientId, "the authorization URL names the client");
  expect(authUrl.searchParams.get("code_challenge_method") === "S256", "PKCE S256");
  expect(authUrl.searchParams.get("resource"), "the RFC 8707 resource parameter");
  expect(authUrl.searchParams.get("redirect_uri") === redirectUrl, "the loopback redirect");
  out.scope_requested = authUrl.searchParams.get("scope");

  step = "open the authorization URL";
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  page = await browser.newPage();
  await page.goto(authUrl.href);

  step = "sign in";
  expect(new URL(page.url()).pathname === "/login", `the anonymous browser is sent to sign in (at ${page.url()}): ${(await page.locator("body").innerText()).slice(0, 300)}`);
  await page.getByLabel("Email").fill(args.email);
  await page.getByLabel("Password").fill(args.password);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.waitForLoadState();
  if (new URL(page.url()).pathname === "/login") {
    const alert = await page.getByRole("alert").textContent().catch(() => "");
    throw new Failure(`${step}: still on the sign-in page: ${alert || (await page.locator("body").innerText()).slice(0, 300)}`);
  }

  step = "tenant picker";
  out.tenant_picker = new URL(page.url()).pathname === "/tenants";
  if (out.tenant_picker) {
    await page.locator("main form button[type=submit], form[action='/tenants'] button[type=submit]").first().click();
    await page.waitForLoadState();
  }

  step = "consent";
  const approve = page.getByRole("button", { name: "Approve" });
  if ((await approve.count()) === 0) {
    throw new Failure(`${step}: no consent screen at ${page.url()}: ${(await page.locator("body").innerText()).slice(0, 500)}`);
  }
  const consentText = await page.locator("body").innerText();
  expect(consentText.includes(`Gatehouse TS SDK e2e (${mode})`), "the consent screen names the client");
  out.tenant = /\bin (?:.+) \(([a-z0-9-]+)\)\./.exec(consentText)?.[1] ?? null;
  out.rights_offered = await page.locator("input[name=right]").count();
  out.rights_ticked = await page.locator("input[name=right]:checked").count();
  expect(out.rights_ticked > 0, "some rights are ticked");
  await approve.click();

  step = "callback";
  const params = await Promise.race([
    callbackArrived,
    new Promise((_, reject) => setTimeout(() => reject(new Failure(`${step}: no redirect to ${redirectUrl} within 15 s`)), 15000)),
  ]);
  await page.waitForURL((u) => u.href.startsWith(redirectUrl), { timeout: 5000 }).catch(() => {});
  expect(!params.get("error"), `the AS answered ${params.get("error")}: ${params.get("error_description")}`);
  expect(params.get("code"), "a code");
  expect(params.get("state") === provider.state(), `state round-trips (${params.get("state")})`);
  expect(params.get("iss") === asMeta.issuer, `iss is the issuer (RFC 9207): ${params.get("iss")} vs ${asMeta.issuer}`);
  await browser.close();
  browser = undefined;
  page = undefined;

  step = "token exchange";
  {
    // finishAuth on a transport that saw the 401 (the SDK checks iss and redeems the code).
    const { transport } = newClient(provider);
    await transport.finishAuth(params);
  }
  expect(provider.saved.length === 1, "the SDK saved one token set");
  const first = provider.saved[0];
  expect(first.access_token && first.refresh_token, "access and refresh tokens");
  out.scope_granted = first.scope;
  out.expires_in = first.expires_in;

  step = "connect with the token";
  const { client, transport } = newClient(provider);
  await client.connect(transport);
  out.protocol = client.getNegotiatedProtocolVersion();
  expect(out.protocol === PROTOCOL, `negotiated ${PROTOCOL}, got ${out.protocol}`);

  step = "tools/list";
  const { tools } = await client.listTools();
  out.tools = tools.length;
  expect(tools.length > 0, "tools are listed");
  const byName = new Map(tools.map((t) => [t.name, t]));
  let call;
  if (byName.get("find_customers")?.inputSchema?.properties?.query) call = { name: "find_customers", arguments: { query: "a" } };
  else {
    const read = tools.find((t) => t.annotations?.readOnlyHint && !(t.inputSchema?.required ?? []).length);
    expect(read, `a read tool without required arguments among ${[...byName.keys()].join(", ")}`);
    call = { name: read.name, arguments: {} };
  }

  step = `call ${call.name}`;
  const result = await client.callTool(call);
  expect(!result.isError, `${call.name} succeeded: ${firstText(result).slice(0, 300)}`);
  out.called = call.name;

  step = "refresh (the provider reports the access token expired)";
  provider.expired = true;
  const again = await client.callTool(call);
  expect(!again.isError, `${call.name} succeeded after the refresh: ${firstText(again).slice(0, 300)}`);
  expect(provider.saved.length === 2, `the SDK refreshed and saved new tokens (saved ${provider.saved.length} sets)`);
  const second = provider.saved[1];
  expect(
    trail.some((t) => t.url === asMeta.token_endpoint && t.step === step && t.status === 200),
    "the refresh went to the token endpoint and got 200",
  );
  out.refreshed = true;
  out.access_changed = second.access_token !== first.access_token;
  expect(out.access_changed, "the refreshed access token differs from the first");
  expect(second.refresh_token !== first.refresh_token, "the refresh token rotated");
  expect((await statusWith(second.access_token)) === 200, "the new access token works through the load balancer");

  step = "refresh (the access token is revoked at the AS)";
  expect(asMeta.revocation_endpoint, "the AS advertises a revocation endpoint");
  const revoked = await tracingFetch(asMeta.revocation_endpoint, {
    method: "POST",
    headers: { "content-type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({ token: second.access_token, token_type_hint: "access_token", client_id: clientId }),
  });
  expect(revoked.status === 200, `RFC 7009 revocation answered ${revoked.status}`);
  expect((await statusWith(second.access_token)) === 401, "the revoked access token is refused");
  const third = await client.callTool(call);
  expect(!third.isError, `${call.name} succeeded after the second refresh: ${firstText(third).slice(0, 300)}`);
  expect(provider.saved.length === 3, `the SDK refreshed again on the worker's 401 (saved ${provider.saved.length} sets)`);
  const last = provider.saved[2];
  expect(last.access_token !== second.access_token && last.refresh_token !== second.refresh_token, "both tokens rotated again");
  expect(
    trail.some((t) => t.step === step && t.status === 401 && /invalid_token/.test(t.www_authenticate ?? "")),
    "the worker answered the revoked token with 401 invalid_token",
  );
  out.refreshed_after_revoke = true;
  await client.close();

  if (mode === "cimd") {
    out.document_fetches = documentFetches.filter((f) => f.path).length;
    // A fixed port may hit the AS's cached copy; a fresh URL must be fetched.
    expect(args["cimd-port"] || documentFetches.some((f) => f.path), "the AS fetched the metadata document");
  }
  out.invalidated = provider.invalidated ?? [];
  writeFileSync(join(shots, `${mode}-http.txt`), trail.map((t) => JSON.stringify(t)).join("\n") + "\n");
  console.log(JSON.stringify(out));
  callbackServer.close();
  metadataServer?.close();
  process.exit(0);
} catch (error) {
  if (mode === "cimd") console.error(`metadata document fetches seen: ${JSON.stringify(documentFetches)}`);
  await fail(error);
}
