// Drives the console's Approvals page while an agent (plain fetch from node) waits on a person.
// Usage: node approvals.mjs --control URL --mcp URL --token AGENT_TOKEN --customer cus_…
//          --email ADMIN_EMAIL --password P --shots DIR
// Needs the tenant's approval policy to say a person approves `notify` actions.
// Prints one JSON line with what it saw; exits non-zero (after a screenshot) on any failure.
import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, v, i, all) => (i % 2 === 0 ? [...pairs, [v.replace(/^--/, ""), all[i + 1]]] : pairs), []),
);
for (const name of ["control", "mcp", "token", "customer", "email", "password"]) {
  if (!args[name]) {
    console.error(`missing --${name}\nusage: node approvals.mjs --control URL --mcp URL --token AGENT_TOKEN --customer cus_… --email ADMIN_EMAIL --password P --shots DIR`);
    process.exit(2);
  }
}
const control = args.control.replace(/\/$/, "");
const shots = args.shots ?? "screenshots";
mkdirSync(shots, { recursive: true });

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const page = await browser.newPage();
const out = {};
let step = "start";
function expect(condition, message) {
  if (!condition) throw new Error(`${step}: ${message}`);
}

// One MCP tools/call as the agent; returns the JSON-RPC result ({isError, structuredContent, …}).
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
      jsonrpc: "2.0",
      id: 1,
      method: "tools/call",
      params: {
        name,
        arguments: toolArgs,
        _meta: { "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {} },
      },
    }),
  });
  const text = await response.text();
  expect(response.ok, `${name}: HTTP ${response.status}: ${text.slice(0, 500)}`);
  // A streamed answer carries the JSON-RPC message in its last `data:` line.
  let message;
  try {
    message = (response.headers.get("content-type") ?? "").includes("text/event-stream")
      ? JSON.parse(text.split("\n").filter((l) => l.startsWith("data:")).pop().slice(5))
      : JSON.parse(text);
  } catch {
    expect(false, `${name}: the answer is not JSON-RPC: ${text.slice(0, 500)}`);
  }
  expect(message.result, `${name}: no JSON-RPC result: ${JSON.stringify(message).slice(0, 500)}`);
  return message.result;
}

// Asks the agent's tool to prepare a customer message; it must wait for a person.
async function prepare(subject, body) {
  const result = await callTool("send_customer_message", { customer: args.customer, subject, body });
  const sc = result.structuredContent ?? {};
  expect(!result.isError && sc.status === "AWAITING_APPROVAL", `send_customer_message should answer AWAITING_APPROVAL (is the notify policy person_approves?), got ${JSON.stringify(result).slice(0, 600)}`);
  expect(/^pac_/.test(sc.action ?? ""), `the answer names the action (pac_…), got ${sc.action}`);
  expect(sc.confirm_token && sc.confirm_summary, "the answer has confirm_token and confirm_summary");
  return sc;
}

const confirm = (prepared) =>
  callTool("confirm_action", { confirm_token: prepared.confirm_token, confirm_summary: prepared.confirm_summary });

// The number in the navigation's "(N)"; an empty count is 0.
async function navCount() {
  const text = ((await page.locator("#approvals-count").textContent()) ?? "").trim();
  const m = text.match(/^\((\d+)\)$/);
  expect(text === "" || m, `the navigation count reads "${text}", not empty or "(N)"`);
  return m ? Number(m[1]) : 0;
}

// The card of one waiting action on /approvals, after checking it shows what a person needs.
async function openCard(prepared, subject, body) {
  await page.goto(`${control}/approvals`);
  expect((await page.locator("h1").textContent()) === "Approvals", "the Approvals page opens");
  const card = page.locator(`div.card.approval[data-action="${prepared.action}"]`);
  expect((await card.count()) === 1, `one card for ${prepared.action} (cards: ${await page.locator("div.card.approval").count()})`);
  const text = await card.textContent();
  const email = (await card.locator(".email").textContent()) ?? "";
  expect(email.includes(subject) && email.includes(body), `the card renders the email as an email; it reads: ${email.slice(0, 400)}`);
  const pre = (await card.locator("pre").textContent()) ?? "";
  expect(text.includes(prepared.confirm_summary), `the card shows the summary "${prepared.confirm_summary}"; it reads: ${text.slice(0, 400)}`);
  expect(pre.includes(subject), `the card's <pre> shows the subject "${subject}"; it reads: ${pre.slice(0, 400)}`);
  expect(pre.includes(body), `the card's <pre> shows the body "${body}"; it reads: ${pre.slice(0, 400)}`);
  expect(/Asked by/i.test(text), "the card says who asked");
  expect(/expires/i.test(text), "the card shows when it expires");
  return card;
}

try {
  step = "sign in";
  await page.goto(`${control}/connections`);
  expect(page.url().includes("/login"), "an anonymous visit is sent to sign in");
  await page.getByLabel("Email").fill(args.email);
  await page.getByLabel("Password").fill(args.password);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.waitForURL(/\/connections$/);
  // The script fills the count on load; read it once that first poll has answered.
  await page.waitForResponse((r) => r.url().endsWith("/approvals/count"), { timeout: 10_000 }).catch(() => {});
  await page.waitForTimeout(300);
  expect((await page.getByRole("link", { name: /^Approvals/ }).count()) === 1, "the navigation has an Approvals link");
  const before = await navCount();
  out.count_before = before;

  step = "agent prepares a message";
  const subject1 = "Browser approval";
  const body1 = "Your technician arrives at 9.";
  // Any navigation of the page from here until the count shows would mean it was not live.
  let navigations = 0;
  page.on("framenavigated", (frame) => {
    if (frame === page.mainFrame()) navigations += 1;
  });
  const navigationsBefore = navigations;
  const approved = await prepare(subject1, body1);
  out.approved_action = approved.action;

  step = "the agent cannot confirm before a person approves";
  {
    const early = await confirm(approved);
    const code = early.structuredContent?.error?.code;
    expect(early.isError === true && code === "awaiting_approval", `confirm_action before approval should be an awaiting_approval error, got ${JSON.stringify(early).slice(0, 600)}`);
  }

  step = "the navigation count updates live";
  {
    const deadline = Date.now() + 15_000;
    let n = before;
    while (Date.now() < deadline) {
      n = await navCount();
      if (n >= Math.max(1, before + 1)) break;
      await page.waitForTimeout(250);
    }
    expect(n >= Math.max(1, before + 1), `within 15 s the count should read at least (${Math.max(1, before + 1)}); it reads "${(await page.locator("#approvals-count").textContent()) ?? ""}"`);
    expect(navigations === navigationsBefore, "the page was not reloaded");
    expect(page.url().endsWith("/connections"), "still on /connections");
    out.live_count_seen = true;
    out.live_count = n;
    await page.screenshot({ path: join(shots, "approvals-count-live.png"), fullPage: true });
  }

  step = "approve it in the console";
  {
    await page.getByRole("link", { name: /^Approvals/ }).click();
    await page.waitForURL(/\/approvals$/);
    const card = await openCard(approved, subject1, body1);
    await page.screenshot({ path: join(shots, "approvals-card.png"), fullPage: true });
    await card.getByLabel(`Comment on approving ${approved.action}`).fill("customer asked for it");
    await card.getByRole("button", { name: "Approve" }).click();
    await page.waitForLoadState();
    const status = page.getByRole("status");
    expect((await status.count()) === 1, `a status message after approving; the page reads: ${(await page.locator("main").textContent()).slice(0, 400)}`);
    const message = (await status.textContent()) ?? "";
    expect(message.includes("Approved and executed"), `the status says "Approved and executed"; it says: ${message}`);
    expect(message.includes(approved.action), `the status names ${approved.action}; it says: ${message}`);
    out.approved_message = message.trim();
    await page.screenshot({ path: join(shots, "approvals-approved.png"), fullPage: true });
  }

  step = "the agent learns it was executed";
  {
    const result = await confirm(approved);
    const sc = result.structuredContent ?? {};
    expect(!result.isError && sc.status === "EXECUTED", `confirm_action after approval should answer EXECUTED, got ${JSON.stringify(result).slice(0, 600)}`);
    out.agent_status = sc.status;
  }

  step = "agent prepares a second message";
  const subject2 = "Browser denial";
  const body2 = "Your technician arrives at 10.";
  const denied = await prepare(subject2, body2);
  out.denied_action = denied.action;

  step = "deny it in the console";
  {
    const card = await openCard(denied, subject2, body2);
    expect((await page.locator(`div.card.approval[data-action="${approved.action}"]`).count()) === 0, "the approved action no longer waits");
    await card.getByLabel(`Comment on denying ${denied.action}`).fill("not today");
    await card.getByRole("button", { name: "Deny" }).click();
    await page.waitForLoadState();
    const status = page.getByRole("status");
    expect((await status.count()) === 1, `a status message after denying; the page reads: ${(await page.locator("main").textContent()).slice(0, 400)}`);
    const message = (await status.textContent()) ?? "";
    expect(message.includes("Denied") && message.includes(denied.action), `the status says ${denied.action} was denied; it says: ${message}`);
    out.denied_message = message.trim();
    await page.screenshot({ path: join(shots, "approvals-denied.png"), fullPage: true });
  }

  step = "the agent learns it was denied, with the reason";
  {
    const result = await confirm(denied);
    const error = result.structuredContent?.error ?? {};
    expect(result.isError === true && error.code === "action_denied", `confirm_action after denial should be an action_denied error, got ${JSON.stringify(result).slice(0, 600)}`);
    const said = JSON.stringify(error) + JSON.stringify(result.content ?? []);
    expect(said.includes("not today"), `the denial carries the reason "not today"; got ${JSON.stringify(result).slice(0, 600)}`);
    out.denied_code = error.code;
  }

  step = "nothing waits any more";
  {
    await page.goto(`${control}/approvals`);
    for (const a of [approved.action, denied.action]) {
      expect((await page.locator(`div.card.approval[data-action="${a}"]`).count()) === 0, `${a} no longer waits`);
    }
    await page.waitForResponse((r) => r.url().endsWith("/approvals/count"), { timeout: 10_000 }).catch(() => {});
    await page.waitForTimeout(300);
    out.count_after = await navCount();
    expect(out.count_after === before, `the navigation count is back to ${before}; it reads ${out.count_after}`);
  }

  console.log(JSON.stringify(out));
  await browser.close();
} catch (error) {
  const file = join(shots, `failure-${step.replace(/\W+/g, "-")}.png`);
  await page.screenshot({ path: file, fullPage: true }).catch(() => {});
  console.error(`${error.message}\nscreenshot: ${file}\nurl: ${page.url()}`);
  await browser.close();
  process.exit(1);
}
