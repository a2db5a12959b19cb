// Drives the Gatehouse console as a tenant admin would, in Debian's Chromium.
// Usage: node console.mjs --control URL --email E --password P --dispatcher EMAIL --shots DIR
// Prints one JSON line with what it saw; exits non-zero (after a screenshot) on any failure.
import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, v, i, all) => (i % 2 === 0 ? [...pairs, [v.replace(/^--/, ""), all[i + 1]]] : pairs), []),
);
const control = args.control;
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

try {
  step = "sign in";
  await page.goto(`${control}/connections`);
  expect(page.url().includes("/login"), "an anonymous visit is sent to sign in");
  await page.getByLabel("Email").fill(args.email);
  await page.getByLabel("Password").fill("wrong password");
  await page.getByRole("button", { name: "Sign in" }).click();
  expect((await page.getByRole("alert").textContent()).includes("wrong"), "a wrong password is refused");
  await page.getByLabel("Email").fill(args.email);
  await page.getByLabel("Password").fill(args.password);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.waitForURL(/\/connections$/);

  step = "create a connection";
  await page.getByLabel("Name").fill("Browser test agent");
  for (const box of await page.locator("input[name=right]").all()) {
    if (await box.isChecked()) await box.uncheck();
  }
  await page.locator("input[name=right][value='bookings:read']").check();
  await page.getByRole("button", { name: "Create connection" }).click();
  const token = (await page.locator("#token").textContent()).trim();
  expect(token.startsWith("gh_mcp_"), "the token is shown");
  const claude = await page.locator("#claude").textContent();
  expect(claude.includes("claude mcp add --transport http") && claude.includes(token), "a ready claude mcp add line");
  out.token = token;
  out.connection = (await page.getByRole("status").locator("code").textContent()).trim();

  step = "the token is shown once";
  await page.goto(`${control}/connections`);
  expect(!(await page.content()).includes(token), "the list never shows the token again");
  const row = page.locator("tr", { hasText: "Browser test agent" });
  expect((await row.textContent()).includes("bookings:read"), "the list shows the narrowed rights");

  step = "revoke it";
  await page.getByRole("link", { name: "Browser test agent" }).click();
  await page.getByRole("link", { name: /Revoke this connection/ }).click();
  await page.getByLabel("Reason").fill("browser test done");
  await page.getByRole("button", { name: "Revoke" }).click();
  expect((await page.content()).includes("status-revoked"), "the connection shows as revoked");

  step = "change a role";
  await page.goto(`${control}/people`);
  const person = page.locator("tr", { hasText: args.dispatcher });
  await person.getByRole("combobox").selectOption("viewer");
  await person.getByRole("button", { name: "Save role" }).click();
  expect((await page.locator("tr", { hasText: args.dispatcher }).textContent()).includes("viewer"), "the new role shows");

  step = "flip the tenant switch";
  await page.goto(`${control}/settings`);
  await page.getByLabel("Reason").fill("browser test");
  await page.getByRole("button", { name: "Turn agent access off" }).click();
  expect((await page.locator("#agent-access-state").textContent()).includes("OFF"), "agent access shows off");
  out.switched_off = true;
  await page.getByLabel("Reason").fill("browser test over");
  await page.getByRole("button", { name: "Turn agent access on" }).click();
  expect(!(await page.locator("#agent-access-state").textContent()).includes("OFF"), "agent access shows on again");

  step = "audit";
  await page.goto(`${control}/audit?tool=connection.revoke`);
  expect((await page.locator("tbody").textContent()).includes(out.connection), "the revocation is in the audit");

  step = "messages";
  await page.goto(`${control}/messages`);
  expect((await page.locator("h1").textContent()) === "Messages", "the messages page opens");

  step = "sign out";
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.waitForURL(/\/login/);
  await page.goto(`${control}/connections`);
  expect(page.url().includes("/login"), "signed out");

  console.log(JSON.stringify(out));
  await browser.close();
} catch (error) {
  const file = join(shots, `failure-${step.replace(/\W+/g, "-")}.png`);
  await page.screenshot({ path: file, fullPage: true }).catch(() => {});
  console.error(`${error.message}\nscreenshot: ${file}\nurl: ${page.url()}`);
  await browser.close();
  process.exit(1);
}
