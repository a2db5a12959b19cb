// Drives passkeys in the console with Chromium's virtual authenticator (DevTools WebAuthn
// domain): an admin adds a passkey, signs in with it, turns on the tenant's policy "decisions
// need a passkey", and approves an agent's action with it; then the hostile cases, each of
// which must be refused with nothing executed: an assertion replayed for another action, an
// expired ceremony, one without user verification, a signature counter that went backwards,
// another person's credential (of another tenant), and a forged post with a valid session
// cookie but no assertion.
// Usage: node passkeys.mjs --control URL --mcp URL --token AGENT_TOKEN --customer cus_…
//          --email ADMIN --password P --other-email E --other-password P --db DATABASE_URL --shots DIR
// Prints one JSON line with what it saw; exits non-zero (after a screenshot) on any failure.
import { chromium } from "playwright-core";
import { execFileSync } from "node:child_process";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, v, i, all) => (i % 2 === 0 ? [...pairs, [v.replace(/^--/, ""), all[i + 1]]] : pairs), []),
);
for (const name of ["control", "mcp", "token", "customer", "email", "password", "dispatcher-email", "other-email", "other-password", "db"]) {
  if (!args[name]) {
    console.error(`missing --${name}\nusage: node passkeys.mjs --control URL --mcp URL --token T --customer cus_… --email E --password P --other-email E --other-password P --db URL --shots DIR`);
    process.exit(2);
  }
}
// Browsers refuse an IP address as a WebAuthn relying party: a loopback console is localhost.
const control = args.control.replace(/\/$/, "").replace("127.0.0.1", "localhost");
const shots = args.shots ?? "screenshots";
mkdirSync(shots, { recursive: true });
const sql = (q) => execFileSync("psql", [args.db, "-Atqc", q], { encoding: "utf8" }).trim();

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const out = {};
let step = "start";
function expect(condition, message) {
  if (!condition) throw new Error(`${step}: ${message}`);
}

// A browser profile with its own virtual platform authenticator (user verification on).
async function person() {
  const context = await browser.newContext();
  const page = await context.newPage();
  const cdp = await context.newCDPSession(page);
  await cdp.send("WebAuthn.enable");
  const { authenticatorId } = await cdp.send("WebAuthn.addVirtualAuthenticator", {
    options: { protocol: "ctap2", transport: "internal", hasResidentKey: true, hasUserVerification: true, isUserVerified: true, automaticPresenceSimulation: true },
  });
  return { context, page, cdp, authenticatorId };
}

async function signIn(page, email, password) {
  await page.goto(`${control}/login`);
  await page.fill('input[name="email"]', email);
  await page.fill('input[name="password"]', password);
  await Promise.all([page.waitForNavigation(), page.click('form[action="/login"] button[type="submit"]')]);
  expect(!page.url().includes("/login"), `password sign-in failed at ${page.url()}`);
}

async function addPasskey(page, name, password) {
  await page.goto(`${control}/account/passkeys`);
  await page.fill('#add-passkey input[name="name"]', name);
  if (password && (await page.locator('#add-passkey input[name="password"]').count()) > 0) {
    await page.fill('#add-passkey input[name="password"]', password);
  }
  await Promise.all([page.waitForURL(/\/account\/passkeys$/, { waitUntil: "load" }), page.click('#add-passkey button[type="submit"]')]);
  await page.waitForSelector(`tr[data-passkey-row] >> text=${name}`, { timeout: 10000 });
}

// One MCP tools/call as the agent; returns structuredContent.
async function callTool(name, toolArgs) {
  const response = await fetch(args.mcp, {
    method: "POST",
    headers: {
      "Content-Type": "application/json",
      Accept: "application/json, text/event-stream",
      "MCP-Protocol-Version": "2026-07-28",
      "Mcp-Method": "tools/call",
      "Mcp-Name": name,
      Authorization: `Bearer ${args.token}`,
    },
    body: JSON.stringify({
      jsonrpc: "2.0", id: 1, method: "tools/call",
      params: { name, arguments: toolArgs, _meta: { "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {} } },
    }),
  });
  const text = await response.text();
  expect(response.ok, `${name}: HTTP ${response.status}: ${text.slice(0, 400)}`);
  const message = (response.headers.get("content-type") ?? "").includes("text/event-stream")
    ? JSON.parse(text.split("\n").filter((l) => l.startsWith("data:")).pop().slice(5))
    : JSON.parse(text);
  expect(message.result, `${name}: no result: ${text.slice(0, 400)}`);
  return message.result.structuredContent ?? {};
}

async function prepare(subject) {
  const sc = await callTool("send_customer_message", { customer: args.customer, subject, body: `${subject}: your booking is confirmed.` });
  expect(sc.status === "AWAITING_APPROVAL", `the action should wait for a person: ${JSON.stringify(sc).slice(0, 400)}`);
  return sc;
}

// Whether an action still waits for a person, as the Approvals page shows it.
async function waiting(action) {
  await page.goto(`${control}/approvals`);
  return (await page.locator(`[data-action="${action}"]`).count()) > 0 ? "waiting" : "gone";
}

// Clicks Approve on an action's card: the service asks for the passkey, and the console
// answers with the confirmation of that decision (not yet signed).
async function approveInUi(page, action, reason) {
  await page.goto(`${control}/approvals`);
  const card = page.locator(`[data-action="${action}"]`);
  await card.locator('form[action$="/approve"] input[name="reason"]').fill(reason);
  await Promise.all([page.waitForNavigation(), card.locator('form[action$="/approve"] button[type="submit"]').click()]);
  await page.waitForSelector("form[data-passkey-confirm]", { timeout: 10000 });
}

// On the confirmation page: signs the ceremony with the passkey and posts the form again.
async function confirmHere(page) {
  const shown = (await page.locator("#confirm-decision").textContent()) ?? "";
  expect(shown.includes("Confirm with your passkey"), `the confirmation names itself: ${shown.slice(0, 300)}`);
  await Promise.all([page.waitForNavigation(), page.click("form[data-passkey-confirm] button[type=submit]")]);
}

// What the last confirmation said the decision sets, row by row.
let lastFacts = [];

// Submits a widening form by `click`: the service names its decision, the console shows its
// confirmation, the passkey signs exactly that one and the form posts again.
async function submitConfirmed(page, click) {
  await Promise.all([page.waitForNavigation(), click()]);
  await page.waitForSelector("form[data-passkey-confirm]", { timeout: 10000 });
  const decision = (await page.locator("#confirm-decision strong").first().textContent()) ?? "";
  lastFacts = await page.$$eval("#confirm-decision table.facts tr", (rows) => rows.map((r) => r.textContent.trim().replace(/\s+/g, " ")));
  // The form comes back sealed: nothing typed is written into the page.
  const carried = await page.$$eval("form[data-passkey-confirm] input", (inputs) => inputs.map((i) => i.name));
  expect(carried.join(",") === "confirm_form", `the confirmation carries only the sealed form: ${carried}`);
  await confirmHere(page);
  return decision.trim();
}

// Makes the browser do a real ceremony for an action's approval but keeps the signed form
// from reaching the server: returns the fields it would have posted (ceremony and assertion).
// `lowerVerification` asks the authenticator for less than the server's options demand.
async function captureAssertion(page, action, reason, lowerVerification) {
  let captured;
  await page.route("**/approvals/*/approve", async (route) => {
    const fields = new URLSearchParams(route.request().postData() ?? "");
    if (!fields.get("passkey_assertion")) return route.continue();
    captured = fields;
    await route.abort();
  });
  await approveInUi(page, action, reason);
  if (lowerVerification) {
    await page.$eval("form[data-passkey-confirm]", (form) => {
      const options = JSON.parse(form.dataset.options);
      options.publicKey.userVerification = "discouraged";
      form.dataset.options = JSON.stringify(options);
    });
  }
  await page.click("form[data-passkey-confirm] button[type=submit]");
  for (let i = 0; i < 100 && !captured; i++) await page.waitForTimeout(100);
  await page.unroute("**/approvals/*/approve");
  expect(captured?.get("passkey_assertion"), `no assertion was posted for ${action}`);
  return captured;
}

// Posts fields to a console URL from the signed-in page (its cookie, its CSRF token).
async function postFrom(page, path, fields) {
  // An aborted form post leaves the tab on an error page of no origin.
  if (!page.url().startsWith(control)) await page.goto(`${control}/approvals`);
  return page.evaluate(async ({ path, fields }) => {
    const r = await fetch(path, { method: "POST", body: new URLSearchParams(fields), credentials: "same-origin", redirect: "manual" });
    return { status: r.status, text: (await r.text()).slice(0, 600) };
  }, { path, fields });
}

const admin = await person();
const page = admin.page;
try {
  step = "sign in with the password and add a passkey";
  await signIn(page, args.email, args.password);
  await addPasskey(page, "Work laptop", args.password);
  out.registered = true;

  step = "sign out, then in with the passkey";
  await Promise.all([page.waitForURL(/\/login/), page.click('form[action="/logout"] button')]);
  await Promise.all([page.waitForNavigation(), page.click("#passkey-sign-in button")]);
  expect(!page.url().includes("/login"), `the passkey sign-in did not sign in: ${page.url()} ${await page.locator(".error").allTextContents()}`);

  step = "turn the tenant's passkey policy on";
  await page.goto(`${control}/settings/security`);
  await page.click('#passkey-policy button[type="submit"]');
  await page.waitForFunction(() => document.querySelector("#passkey-policy")?.textContent.includes("On:"), null, { timeout: 10000 });

  step = "approve an agent's action with the passkey";
  const a = await prepare("Approved with a passkey");
  await approveInUi(page, a.action, "customer asked for it");
  const named = (await page.locator("#confirm-decision").textContent()) ?? "";
  out.confirmation_names_action = named.includes(a.action) || named.toLowerCase().includes("approv");
  await confirmHere(page);
  await page.waitForSelector('p.ok[role="status"]', { timeout: 10000 });
  out.approved_flash = (await page.locator('p.ok[role="status"]').textContent()).trim();
  out.approved_status = await waiting(a.action);
  const seen = await callTool("confirm_action", { confirm_token: a.confirm_token, confirm_summary: a.confirm_summary });
  out.agent_status = seen.status;
  out.agent_sees_proof = seen.approved?.proven ?? null;
  out.approved_action = a.action;

  const csrf = await page.locator('input[name="csrf"]').first().inputValue();

  step = "an assertion made for one action cannot approve another";
  const b = await prepare("Replay source");
  const c = await prepare("Replay target");
  out.source_action = b.action;
  out.target_action = c.action;
  const forB = await captureAssertion(page, b.action, "for b");
  const replay = await postFrom(page, `/approvals/${c.action}/approve`, { csrf, reason: "replayed", passkey_ceremony: forB.get("passkey_ceremony"), passkey_assertion: forB.get("passkey_assertion") });
  out.replayed_other = { status: replay.status, target: await waiting(c.action) };
  const again = await postFrom(page, `/approvals/${b.action}/approve`, { csrf, reason: "used twice", passkey_ceremony: forB.get("passkey_ceremony"), passkey_assertion: forB.get("passkey_assertion") });
  out.replayed_same = { status: again.status, source: await waiting(b.action) };

  step = "a forged post with the session cookie and no assertion";
  const forged = await postFrom(page, `/approvals/${c.action}/approve`, { csrf, reason: "forged" });
  out.forged = { status: forged.status, target: await waiting(c.action), says: forged.text.includes("passkey") };

  step = "an expired ceremony";
  const late = await captureAssertion(page, c.action, "late");
  // Raw SQL on purpose: the clock of a ceremony's store, which no product path moves.
  sql(`UPDATE webauthn_ceremonies SET expires_at = now() - interval '1 second' WHERE used_at IS NULL AND purpose = 'decision'`);
  const expired = await postFrom(page, `/approvals/${c.action}/approve`, { csrf, reason: "late", passkey_ceremony: late.get("passkey_ceremony"), passkey_assertion: late.get("passkey_assertion") });
  out.expired = { status: expired.status, target: await waiting(c.action) };

  step = "an assertion without user verification";
  await admin.cdp.send("WebAuthn.setUserVerified", { authenticatorId: admin.authenticatorId, isUserVerified: false });
  const noUv = await captureAssertion(page, c.action, "no uv", true);
  const unverified = await postFrom(page, `/approvals/${c.action}/approve`, { csrf, reason: "no uv", passkey_ceremony: noUv.get("passkey_ceremony"), passkey_assertion: noUv.get("passkey_assertion") });
  await admin.cdp.send("WebAuthn.setUserVerified", { authenticatorId: admin.authenticatorId, isUserVerified: true });
  out.unverified = { status: unverified.status, target: await waiting(c.action) };

  step = "a signature counter that went backwards";
  // Raw SQL on purpose: a cloned authenticator, as only the stored counter can show it.
  sql(`UPDATE passkeys SET passkey = jsonb_set(passkey, '{cred,counter}', '1000000') WHERE person_id = (SELECT id FROM people WHERE lower(email) = lower('${args.email}'))`);
  const cloned = await captureAssertion(page, c.action, "cloned");
  const backwards = await postFrom(page, `/approvals/${c.action}/approve`, { csrf, reason: "cloned", passkey_ceremony: cloned.get("passkey_ceremony"), passkey_assertion: cloned.get("passkey_assertion") });
  out.counter_backwards = { status: backwards.status, target: await waiting(c.action) };
  // Raw SQL on purpose: the counter back as it was, so the authenticator signs on.
  sql(`UPDATE passkeys SET passkey = jsonb_set(passkey, '{cred,counter}', '0') WHERE person_id = (SELECT id FROM people WHERE lower(email) = lower('${args.email}'))`);

  step = "another person's credential, of another tenant";
  const other = await person();
  await signIn(other.page, args["other-email"], args["other-password"]);
  await addPasskey(other.page, "Their key", args["other-password"]);
  // The admin's ceremony for c, answered by the other person's authenticator.
  const ceremony = await page.evaluate(async ({ action, csrf }) => {
    // The approval posted without a passkey: the console answers with the confirmation.
    const body = new URLSearchParams({ csrf, reason: "x" });
    const r = await fetch(`/approvals/${action}/approve`, { method: "POST", body, credentials: "same-origin" });
    const html = new DOMParser().parseFromString(await r.text(), "text/html");
    const form = html.querySelector("form[data-passkey-confirm]");
    return { needed: !!form, ceremony: form?.dataset.ceremony, options: form ? JSON.parse(form.dataset.options) : null };
  }, { action: c.action, csrf });
  expect(ceremony.needed && ceremony.ceremony, `the admin gets a ceremony: ${JSON.stringify(ceremony).slice(0, 300)}`);
  const theirs = await other.page.evaluate(async (options) => {
    const dec = (s) => Uint8Array.from(atob(s.replace(/-/g, "+").replace(/_/g, "/")), (ch) => ch.charCodeAt(0));
    const enc = (buf) => btoa(String.fromCharCode(...new Uint8Array(buf))).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
    const pk = options.publicKey;
    pk.challenge = dec(pk.challenge);
    delete pk.allowCredentials; // any credential of theirs
    const cred = await navigator.credentials.get({ publicKey: pk });
    return JSON.stringify({ id: cred.id, rawId: enc(cred.rawId), type: cred.type, response: { authenticatorData: enc(cred.response.authenticatorData), clientDataJSON: enc(cred.response.clientDataJSON), signature: enc(cred.response.signature), userHandle: cred.response.userHandle ? enc(cred.response.userHandle) : null }, extensions: {} });
  }, ceremony.options);
  const foreign = await postFrom(page, `/approvals/${c.action}/approve`, { csrf, reason: "foreign key", passkey_ceremony: ceremony.ceremony, passkey_assertion: theirs });
  out.foreign_credential = { status: foreign.status, target: await waiting(c.action) };
  await other.context.close();

  // Every other widening decision, through its own form, confirmed with the passkey: the
  // ceremony the script asks for names the decision the service then checks.
  step = "create a connection with the passkey";
  await page.goto(`${control}/connections/new`);
  await page.fill('form[action="/connections"] input[name="name"]', "Made with a passkey");
  out.connection_decision = await submitConfirmed(page, () => page.click('form[action="/connections"] button[type="submit"]'));
  out.connection_facts = lastFacts;

  step = "raise a role with the passkey";
  await page.goto(`${control}/people`);
  const row = page.locator(`form[action="/people/role"]:has(input[value="${args["dispatcher-email"]}"])`);
  await row.locator('select[name="role"]').selectOption("admin");
  await Promise.all([page.waitForNavigation(), row.locator('button[type="submit"]').click()]);
  // The confirmation page's form carries the passkey step-up.
  await submitConfirmed(page, () => page.click('form[action="/people/role"][method="post"] button[type="submit"]'));

  step = "raise a rate limit with the passkey";
  await page.goto(`${control}/settings/limits`);
  const notifyLimit = page.locator('form[action="/settings/rate-limit"]:has(input[name="class"][value="notify"])').first();
  await notifyLimit.locator('input[name="per_minute"]').fill("60");
  await submitConfirmed(page, () => notifyLimit.locator('button[type="submit"]').click());

  step = "invite someone with the passkey; they join with a passkey of their own";
  {
    await page.goto(`${control}/people/invite`);
    await page.fill('form[action="/people/invite"] input[name="email"]', "passkey.joiner@example.com");
    await page.fill('form[action="/people/invite"] input[name="name"]', "Pat Joiner");
    await page.locator('form[action="/people/invite"] select[name="role"]').selectOption("dispatcher");
    await submitConfirmed(page, () => page.click('form[action="/people/invite"] button[type="submit"]'));
    await page.waitForURL(/\/people\/invitations\/inv_[a-z0-9]+\/sent$/);
    const link = (await page.locator("#invitation-link").textContent()).trim().replace("127.0.0.1", "localhost");
    expect(link.includes("/invitations/gh_inv_"), `the link is shown once after sending: ${link}`);
    const joiner = await person();
    await joiner.page.goto(link);
    await joiner.page.fill('#join-passkey input[name="name"]', "Pat Joiner");
    await Promise.all([joiner.page.waitForURL((u) => !u.pathname.startsWith("/invitations/")), joiner.page.click('#join-passkey button[type="submit"]')]);
    // Signed out, the passkey alone signs them in again.
    await joiner.context.clearCookies();
    await joiner.page.goto(`${control}/login`);
    await Promise.all([joiner.page.waitForURL((u) => !u.pathname.startsWith("/login")), joiner.page.click('#passkey-sign-in button[type="submit"]')]);
    // The link works once.
    const again = await joiner.page.goto(link);
    out.link_again = again.status();
    await joiner.context.close();
  }

  step = "loosen the approval policy with the passkey";
  await page.goto(`${control}/settings/approvals`);
  const notifyPolicy = page.locator('form[action="/settings/approval-policy"]:has(input[name="scope"][value="notify"])');
  await notifyPolicy.locator('select[name="mode"]').selectOption("agent_confirms");
  await submitConfirmed(page, () => notifyPolicy.locator('button[type="submit"]').click());

  step = "agent access off without a passkey, on again with it";
  await page.goto(`${control}/settings`);
  await page.fill('form[action="/settings/agent-access"] input[name="reason"]', "drill");
  await Promise.all([page.waitForNavigation(), page.click('form[action="/settings/agent-access"] button[type="submit"]')]);
  out.access_off = await page.locator("#agent-access-state").textContent();
  await page.fill('form[action="/settings/agent-access"] input[name="reason"]', "drill over");
  await submitConfirmed(page, () => page.click('form[action="/settings/agent-access"] button[type="submit"]'));
  out.access_on = await page.locator("#agent-access-state").textContent();

  step = "the passkey policy needs a passkey to turn off; narrowing does not";
  const off = await postFrom(page, "/settings/passkey-policy", { csrf, to: "off" });
  await page.goto(`${control}/settings/security`);
  const policyShown = (await page.locator("#passkey-policy").textContent()) ?? "";
  out.policy_off_without_passkey = { status: off.status, still_on: policyShown.includes("On:") };
  const deny = await postFrom(page, `/approvals/${c.action}/deny`, { csrf, reason: "not now" });
  out.deny_without_passkey = { status: deny.status, target: await waiting(c.action) };

  step = "the policy off, with the passkey";
  await page.goto(`${control}/settings/security`);
  await submitConfirmed(page, () => page.click('#passkey-policy button[type="submit"]'));

  await page.screenshot({ path: join(shots, "passkeys.png"), fullPage: true });
  console.log(JSON.stringify(out));
  await browser.close();
} catch (err) {
  await page.screenshot({ path: join(shots, "passkeys-failure.png"), fullPage: true }).catch(() => {});
  console.log(JSON.stringify(out));
  console.error(`${step}: ${err.stack ?? err}`);
  await browser.close();
  process.exit(1);
}
