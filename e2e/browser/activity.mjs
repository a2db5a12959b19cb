// Checks the console's activity pictures in Debian's Chromium after an agent (plain fetch from
// node) made a known set of MCP tool calls.
// Usage: node activity.mjs --control URL --mcp URL --token AGENT_TOKEN --connection con_…
//          --email ADMIN_EMAIL --password P --shots DIR
// AGENT_TOKEN belongs to con_…, holds customers:read and bookings:read but not bookings:notify
// (e.g. --rights customers:read,bookings:read), in the full toolset. The script makes 5 find_customers calls, 2 send_customer_message calls
// (refused: permission_denied) and 1 get_booking with a malformed handle (invalid_argument).
// It reads each page's numbers before the calls and expects them to grow by exactly those calls,
// so other traffic of the tenant before the script starts does not disturb it.
// Prints one JSON line with what it saw; exits non-zero (after a screenshot) on any failure.
import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, v, i, all) => (i % 2 === 0 ? [...pairs, [v.replace(/^--/, ""), all[i + 1]]] : pairs), []),
);
for (const name of ["control", "mcp", "token", "connection", "email", "password"]) {
  if (!args[name]) {
    console.error(`missing --${name}\nusage: node activity.mjs --control URL --mcp URL --token AGENT_TOKEN --connection con_… --email ADMIN_EMAIL --password P --shots DIR`);
    process.exit(2);
  }
}
const control = args.control.replace(/\/$/, "");
const connection = args.connection;
const shots = args.shots ?? "screenshots";
mkdirSync(shots, { recursive: true });

// What the script's calls add, per effect class (data-series) and per refusal code.
const CALLS = { find_customers: 5, send_customer_message: 2, get_booking: 1 };
const ADDED = { read: 6, silent_write: 0, notify: 2, wake: 0, alert: 0, delete: 0 };
const ADDED_REFUSALS = { permission_denied: 2, invalid_argument: 1 };
// The legend's words for each series (pictures.rs SERIES).
const LABELS = { read: "read", silent_write: "silent write", notify: "notify", wake: "wake", alert: "alert", delete: "delete" };
// Series 0 (read) is drawn solid in PALETTE[0] (charts.rs).
const READ_FILL = [0x00, 0x72, 0xb2];
const POLL_MS = 500;
const POLL_FOR_MS = 20_000;
// Workers write their counts every 2 s (worker ACTIVITY_FLUSH).
const FLUSH_MS = 2_000;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
const out = {};
let step = "start";
function expect(condition, message) {
  if (!condition) throw new Error(`${step}: ${message}`);
}
const json = (v) => JSON.stringify(v);

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
  expect(message.result, `${name}: no JSON-RPC result: ${json(message).slice(0, 500)}`);
  return message.result;
}

// Everything an activity section shows, read from the DOM: per-series sums of the stacked
// chart's segments, its bars, legend, accessible names, the refusal rows and the latest calls.
async function readSection(id) {
  const section = page.locator(`section.activity#${id}`);
  expect((await section.count()) === 1, `the page has one section#${id}; the page reads: ${((await page.locator("main").textContent()) ?? "").slice(0, 400)}`);
  return section.evaluate((s) => {
    const text = (el) => (el?.textContent ?? "").trim();
    const svgs = [...s.querySelectorAll("figure.picture > svg")];
    const [stacked, refusal] = svgs;
    const series = {};
    for (const seg of stacked?.querySelectorAll("rect.seg") ?? []) {
      series[seg.dataset.series] = (series[seg.dataset.series] ?? 0) + Number(seg.dataset.count);
    }
    const bars = [...(stacked?.querySelectorAll("g.bar") ?? [])].map((g) => ({
      bar: g.dataset.bar,
      total: Number(g.dataset.total),
      segs: [...g.querySelectorAll("rect.seg")].map((r) => ({ bar: r.dataset.bar, count: Number(r.dataset.count), title: text(r.querySelector("title")) })),
    }));
    const legend = [...(stacked?.querySelectorAll("g.legend g.key") ?? [])].map((k) => {
      const t = k.querySelector("text");
      const swatch = k.querySelector("rect");
      const fill = swatch?.getAttribute("fill") ?? "";
      const pattern = fill.match(/^url\(#(.+)\)$/)?.[1];
      return {
        series: k.dataset.series,
        text: text(t),
        width: t ? t.getBBox().width : 0,
        swatchPattern: !!(pattern && stacked.querySelector(`pattern[id="${pattern}"]`)),
      };
    });
    const a11y = svgs.map((svg) => {
      const ids = (svg.getAttribute("aria-labelledby") ?? "").split(/\s+/).filter(Boolean);
      return {
        role: svg.getAttribute("role"),
        ids,
        targets: ids.map((i) => {
          const el = document.getElementById(i);
          return {
            id: i,
            tag: el?.tagName ?? null,
            inside: !!el && svg.contains(el),
            unique: document.querySelectorAll(`[id="${CSS.escape(i)}"]`).length === 1,
            text: text(el),
          };
        }),
      };
    });
    const refusals = [...(refusal?.querySelectorAll("g.row") ?? [])].map((g) => ({
      reason: g.dataset.reason,
      count: Number(g.dataset.count),
      shown: text(g.querySelector("text")),
      value: text(g.querySelector("text.value")),
      title: text(g.querySelector("title")),
    }));
    const table = s.querySelector("table.recent-calls");
    const heads = [...(table?.querySelectorAll("thead th") ?? [])].map(text);
    const recent = [...(table?.querySelectorAll("tbody tr") ?? [])].map((tr) => {
      const cells = [...tr.children];
      const cell = (name) => cells[heads.indexOf(name)];
      const link = cell("Connection")?.querySelector("a");
      return {
        tool: text(cell("Tool")),
        effect: text(cell("Effect")),
        outcome: text(cell("Outcome")),
        outcomeClass: cell("Outcome")?.className ?? "",
        href: link?.getAttribute("href") ?? null,
        name: link ? text(link) : null,
      };
    });
    const spanLink = [...s.querySelectorAll("a")].find((a) => /^Show the /.test(text(a)));
    return {
      heading: text(s.querySelector("h2")),
      figures: s.querySelectorAll("figure.picture").length,
      summary: text(s.querySelector("p")),
      series,
      bars,
      legend,
      a11y,
      stackedDesc: text(stacked?.querySelector("desc")),
      refusalDesc: text(refusal?.querySelector("desc")),
      refusals,
      heads,
      recent,
      spanLink: spanLink ? { text: text(spanLink), href: spanLink.getAttribute("href") } : null,
    };
  });
}

const seriesOf = (seen, key) => seen.series[key] ?? 0;
const refusalsOf = (seen) => Object.fromEntries(seen.refusals.map((r) => [r.reason.split(" ")[0], r.count]));
const numbers = (seen) => ({ series: Object.fromEntries(Object.keys(ADDED).map((k) => [k, seriesOf(seen, k)])), refusals: refusalsOf(seen) });

// Reads a section until two reads one flush apart agree: what workers held when we looked.
async function settledBaseline(url, id) {
  let before = null;
  const deadline = Date.now() + POLL_FOR_MS;
  while (Date.now() < deadline) {
    await page.goto(url);
    const now = numbers(await readSection(id));
    if (before && json(now) === json(before)) return now;
    before = now;
    await page.waitForTimeout(FLUSH_MS + 500);
  }
  expect(false, `the numbers of ${url} did not settle within ${POLL_FOR_MS / 1000} s before the calls; last: ${json(before)}`);
}

// Reloads a page every POLL_MS until the stacked chart has every call the script made, and the
// latest calls list every one of them (counts reaching their sum can include another
// connection's calls flushed late, before this connection's own).
async function pollUntilCounted(url, id, base) {
  const deadline = Date.now() + POLL_FOR_MS;
  const made = Object.values(CALLS).reduce((a, n) => a + n, 0);
  let seen;
  while (true) {
    await page.goto(url);
    seen = await readSection(id);
    const all = Object.entries(ADDED).every(([k, n]) => seriesOf(seen, k) >= base.series[k] + n);
    const mine = id === "connection-activity" ? seen.recent : seen.recent.filter((r) => r.href === `/connections/${connection}`);
    if ((all && mine.length >= made) || Date.now() > deadline) break;
    await page.waitForTimeout(POLL_MS);
  }
  const want = Object.fromEntries(Object.entries(ADDED).map(([k, n]) => [k, base.series[k] + n]));
  expect(
    Object.keys(ADDED).every((k) => seriesOf(seen, k) >= want[k]),
    `within ${POLL_FOR_MS / 1000} s the chart should count ${json(want)} calls per series; it shows ${json(numbers(seen).series)}`,
  );
  return seen;
}

// The checks every activity section must pass once the calls are counted.
function checkSection(seen, base, { perConnection, bars }) {
  const outer = step;
  const want = Object.fromEntries(Object.entries(ADDED).map(([k, n]) => [k, base.series[k] + n]));
  for (const k of Object.keys(ADDED)) {
    expect(seriesOf(seen, k) === want[k], `rect.seg[data-series=${k}] data-counts sum to ${seriesOf(seen, k)}, expected exactly ${want[k]} (before ${base.series[k]} + ${ADDED[k]} from the calls); all: ${json(numbers(seen).series)}`);
  }
  expect(seen.figures === 2, `two figure.picture (calls, refusals); found ${seen.figures}`);
  expect(seen.bars.length === bars, `the stacked chart has ${bars} g.bar (one per hour); found ${seen.bars.length}`);
  for (const b of seen.bars) {
    const sum = b.segs.reduce((a, s) => a + s.count, 0);
    expect(b.total === sum, `g.bar[data-bar=${b.bar}] data-total ${b.total} is the sum of its segments ${sum}`);
    expect(b.segs.every((s) => s.bar === b.bar && s.count > 0 && s.title.endsWith(`: ${s.count}`)), `bar ${b.bar}: each segment has its bar, a positive count and a <title> ending in its count: ${json(b.segs)}`);
  }
  const total = Object.values(seen.series).reduce((a, n) => a + n, 0);
  const summary = seen.summary.match(/^(\d+) calls? · Show the /);
  expect(summary && Number(summary[1]) === total, `the section's summary gives the total ${total}; it reads "${seen.summary}"`);

  step = `${outer} · refusals`;
  const refusals = refusalsOf(seen);
  for (const [code, n] of Object.entries(ADDED_REFUSALS)) {
    const want = (base.refusals[code] ?? 0) + n;
    const rows = seen.refusals.filter((r) => r.reason.startsWith(`${code} `) || r.reason === code);
    expect(rows.length === 1, `one refusal row whose data-reason starts with ${code}; rows: ${json(seen.refusals)}`);
    expect(/^[a-z_]+ \(.+\)$/.test(rows[0].reason), `the reason reads "code (meaning)": "${rows[0].reason}"`);
    expect(refusals[code] === want, `the ${code} row counts ${refusals[code]}, expected ${want}`);
  }
  for (const r of seen.refusals) {
    expect(r.value === String(r.count), `the row "${r.reason}" shows its number ${r.count} as text; it shows "${r.value}"`);
    expect(r.title === `${r.reason}: ${r.count}`, `the row "${r.reason}" has the tooltip "${r.reason}: ${r.count}"; it has "${r.title}"`);
    expect(r.shown.length > 0 && (r.reason.startsWith(r.shown.replace(/…$/, ""))), `the row's label "${r.shown}" is (the start of) its reason "${r.reason}"`);
  }
  const sorted = seen.refusals.map((r) => r.count);
  expect(sorted.every((n, i) => i === 0 || sorted[i - 1] >= n), `refusal rows are largest first: ${json(sorted)}`);

  step = `${outer} · accessibility`;
  expect(seen.a11y.length === 2, `two charts (svg) in the figures; found ${seen.a11y.length}`);
  for (const [i, svg] of seen.a11y.entries()) {
    expect(svg.role === "img", `chart ${i} has role=img; it has ${svg.role}`);
    expect(svg.ids.length === 2, `chart ${i} aria-labelledby names a title and a desc: "${svg.ids.join(" ")}"`);
    const [title, desc] = svg.targets;
    expect(title.tag === "title" && desc.tag === "desc", `chart ${i} aria-labelledby points at <title> then <desc>; it points at ${json(svg.targets.map((t) => [t.id, t.tag]))}`);
    for (const t of svg.targets) {
      expect(t.inside && t.unique && t.text.length > 0, `chart ${i}: #${t.id} is a unique, non-empty element inside the chart: ${json(t)}`);
    }
  }
  const words = Object.entries(want).map(([k, n]) => `${LABELS[k]} ${n}`).join(", ");
  expect(seen.stackedDesc.includes(`${total} call${total === 1 ? "" : "s"} in all: ${words}.`), `the calls chart's <desc> gives the totals "${total} calls in all: ${words}."; it reads "${seen.stackedDesc}"`);
  const refusalTotal = seen.refusals.reduce((a, r) => a + r.count, 0);
  expect(seen.refusalDesc.includes(`${refusalTotal} refusals in all`), `the refusal chart's <desc> gives the total ${refusalTotal}; it reads "${seen.refusalDesc}"`);
  for (const r of seen.refusals) {
    expect(seen.refusalDesc.includes(`${r.reason} ${r.count}`), `the refusal chart's <desc> has "${r.reason} ${r.count}"; it reads "${seen.refusalDesc}"`);
  }
  expect(seen.legend.length === Object.keys(LABELS).length, `the legend has ${Object.keys(LABELS).length} keys; it has ${seen.legend.length}`);
  for (const key of seen.legend) {
    const label = LABELS[key.series];
    expect(label, `legend key for an unknown series ${key.series}`);
    expect(key.text === `${label} · ${seriesOf(seen, key.series)}`, `the legend says "${label} · ${seriesOf(seen, key.series)}" in text; it says "${key.text}"`);
    expect(key.width > 0, `the legend text "${key.text}" is drawn (width ${key.width})`);
    expect(key.swatchPattern, `the legend swatch of ${key.series} is filled with its pattern`);
  }

  step = `${outer} · latest calls`;
  const mine = perConnection ? seen.recent : seen.recent.filter((r) => r.href === `/connections/${connection}`);
  const expectedHeads = perConnection ? ["When", "Tool", "Effect", "Outcome", "Time"] : ["When", "Connection", "Tool", "Effect", "Outcome", "Time"];
  expect(json(seen.heads) === json(expectedHeads), `the latest calls have the columns ${json(expectedHeads)}; they have ${json(seen.heads)}`);
  if (!perConnection) {
    const found = seen.recent.find((r) => r.tool === "find_customers" && r.href === `/connections/${connection}`);
    expect(found, `a latest call of find_customers whose connection links to /connections/${connection}; rows: ${json(seen.recent.slice(0, 10))}`);
    expect(found.name && found.name.length > 0, "the connection link shows the connection's name");
  }
  // The script's calls are the newest of this connection.
  const newest = mine.slice(0, 8);
  const tally = {};
  for (const r of newest) tally[r.tool] = (tally[r.tool] ?? 0) + 1;
  expect(json(Object.entries(tally).sort()) === json(Object.entries(CALLS).sort()), `the newest 8 calls of ${connection} are ${json(CALLS)}; they are ${json(tally)}`);
  for (const r of newest) {
    const outcome = { find_customers: "ok", send_customer_message: "permission_denied", get_booking: "invalid_argument" }[r.tool];
    expect(r.outcome === outcome, `${r.tool} shows the outcome ${outcome}; it shows "${r.outcome}"`);
    expect(r.outcomeClass === (outcome === "ok" ? "outcome-ok" : "outcome-refused"), `${r.tool}'s outcome cell is marked ${outcome === "ok" ? "ok" : "refused"}: class "${r.outcomeClass}"`);
    expect(r.effect === (r.tool === "send_customer_message" ? "notify" : "read"), `${r.tool} shows its effect class; it shows "${r.effect}"`);
  }
  step = outer;
  return { total, newest: newest.map((r) => r.tool) };
}

// Decodes a PNG in the page and counts pixels near the read fill (inside and outside the given
// boxes, in the PNG's pixels) and near-white ones.
async function countPixels(png, boxes) {
  return page.evaluate(
    async ({ b64, fill, boxes }) => {
      const img = new Image();
      img.src = `data:image/png;base64,${b64}`;
      await img.decode();
      const canvas = document.createElement("canvas");
      canvas.width = img.naturalWidth;
      canvas.height = img.naturalHeight;
      const g = canvas.getContext("2d");
      g.drawImage(img, 0, 0);
      const { data, width, height } = g.getImageData(0, 0, canvas.width, canvas.height);
      let fillIn = 0, fillOut = 0, white = 0, dark = 0;
      for (let y = 0; y < height; y++) {
        for (let x = 0; x < width; x++) {
          const i = (y * width + x) * 4;
          const [r, gr, b] = [data[i], data[i + 1], data[i + 2]];
          if (Math.abs(r - fill[0]) <= 40 && Math.abs(gr - fill[1]) <= 40 && Math.abs(b - fill[2]) <= 40) {
            if (boxes.some((q) => x >= q.x && x < q.x + q.w && y >= q.y && y < q.y + q.h)) fillIn++;
            else fillOut++;
          }
          if (r >= 235 && gr >= 235 && b >= 235) white++;
          if (r < 20 && gr < 20 && b < 20) dark++;
        }
      }
      const boxArea = boxes.reduce((a, q) => a + Math.max(0, q.w) * Math.max(0, q.h), 0);
      return { width, height, fillIn, fillOut, white, dark, boxArea };
    },
    { b64: png.toString("base64"), fill: READ_FILL, boxes },
  );
}

try {
  step = "sign in";
  await page.goto(`${control}/activity`);
  expect(page.url().includes("/login"), "an anonymous visit to /activity is sent to sign in");
  await page.getByLabel("Email").fill(args.email);
  await page.getByLabel("Password").fill(args.password);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.waitForURL((u) => !u.pathname.startsWith("/login"));
  await page.getByRole("link", { name: "Activity", exact: true }).click();
  await page.waitForURL(/\/activity$/);
  expect((await page.locator("h1").textContent()) === "Activity", "the navigation's Activity link opens the Activity page");

  step = "numbers before the calls";
  const tenantUrl = `${control}/activity`;
  const connectionUrl = `${control}/connections/${connection}`;
  const tenantBase = await settledBaseline(tenantUrl, "tenant-activity");
  const connectionBase = await settledBaseline(connectionUrl, "connection-activity");
  out.baseline = { tenant: tenantBase, connection: connectionBase };

  step = "agent calls";
  for (let i = 0; i < CALLS.find_customers; i++) {
    const r = await callTool("find_customers", { query: "a" });
    expect(r.isError !== true && r.structuredContent && !r.structuredContent.error, `find_customers succeeds; got ${json(r).slice(0, 600)}`);
  }
  for (let i = 0; i < CALLS.send_customer_message; i++) {
    const r = await callTool("send_customer_message", { customer: "cus_nope", subject: "Hello", body: "Hi" });
    const code = r.structuredContent?.error?.code;
    expect(r.isError === true && code === "permission_denied", `send_customer_message without bookings:notify is a permission_denied error; got ${json(r).slice(0, 600)}`);
  }
  for (let i = 0; i < CALLS.get_booking; i++) {
    const r = await callTool("get_booking", { booking: "nope" });
    const code = r.structuredContent?.error?.code;
    expect(r.isError === true && code === "invalid_argument", `get_booking with a malformed handle is an invalid_argument error; got ${json(r).slice(0, 600)}`);
  }

  step = "tenant activity";
  const day = await pollUntilCounted(tenantUrl, "tenant-activity", tenantBase);
  expect(/last 24 hours/.test(day.heading), `the section is about the last 24 hours; its heading is "${day.heading}"`);
  const tenantSeen = checkSection(day, tenantBase, { perConnection: false, bars: 24 });
  out.read = seriesOf(day, "read") - tenantBase.series.read;
  out.notify = seriesOf(day, "notify") - tenantBase.series.notify;
  out.refusals = Object.fromEntries(Object.keys(ADDED_REFUSALS).map((c) => [c, refusalsOf(day)[c] - (tenantBase.refusals[c] ?? 0)]));
  out.day_bars = day.bars.length;
  out.recent_tools = tenantSeen.newest;
  out.refusal_labels = day.refusals.map((r) => r.shown);
  {
    // Chromium's accessibility tree names each chart from its title and desc.
    const section = page.locator("#tenant-activity");
    const calls = section.getByRole("img", { name: "Calls per hour over the last 24 hours, by effect class" });
    const refused = section.getByRole("img", { name: "Calls that did not succeed over the last 24 hours, by reason" });
    expect((await calls.count()) === 1 && (await refused.count()) === 1, "both charts are images named by their titles in the accessibility tree");
    expect((await section.getByRole("heading", { name: "Activity over the last 24 hours" }).count()) === 1, "the section has its heading");
  }
  await page.screenshot({ path: join(shots, "activity.png"), fullPage: true });

  step = "the drawn bars";
  {
    const figure = page.locator("#tenant-activity figure.picture").first();
    await figure.scrollIntoViewIfNeeded();
    const png = await figure.screenshot({ path: join(shots, "activity-calls-chart.png") });
    // Where the read segments are, in the screenshot's pixels (inset 2 px against edge blur).
    const boxes = await figure.evaluate((f) => {
      const o = f.getBoundingClientRect();
      return [...f.querySelectorAll('rect.seg[data-series="read"]')].map((r) => {
        const b = r.getBoundingClientRect();
        return { x: Math.ceil(b.left - o.left) + 2, y: Math.ceil(b.top - o.top) + 2, w: Math.floor(b.width) - 4, h: Math.floor(b.height) - 4 };
      });
    });
    const px = await countPixels(png, boxes);
    out.pixels = px;
    out.drawn_pixels = px.fillIn;
    expect(px.width > 100 && px.height > 50, `the chart screenshot has a size: ${px.width}×${px.height}`);
    expect(px.fillIn > 0, `pixels of the read colour rgb(${READ_FILL}) inside the read bars; counts: ${json(px)}`);
    expect(px.fillIn >= 0.9 * px.boxArea, `the read bars are filled with their colour: ${px.fillIn} of ${px.boxArea} pixels; counts: ${json(px)}`);
    expect(px.white > 0.5 * px.width * px.height, `most of the chart is white background, so the image is not blank or black: ${json(px)}`);
  }

  step = "the last 7 days";
  {
    expect(day.spanLink && day.spanLink.text === "Show the last 7 days", `the section links to the last 7 days; ${json(day.spanLink)}`);
    await page.locator("#tenant-activity").getByRole("link", { name: "Show the last 7 days" }).click();
    await page.waitForURL(/span=week/);
    expect(new URL(page.url()).searchParams.get("span") === "week", `the URL has span=week: ${page.url()}`);
    const week = await readSection("tenant-activity");
    expect(/last 7 days/.test(week.heading), `the heading says the last 7 days: "${week.heading}"`);
    expect(week.bars.length === 28, `the week's stacked chart has 28 g.bar (6 hours each); it has ${week.bars.length}`);
    for (const k of Object.keys(ADDED)) {
      expect(seriesOf(week, k) >= seriesOf(day, k), `the week counts at least the day's ${k} calls: ${seriesOf(week, k)} < ${seriesOf(day, k)}`);
    }
    expect(week.spanLink?.text === "Show the last 24 hours", `the week links back to the day: ${json(week.spanLink)}`);
    expect(week.a11y.every((s) => s.role === "img" && s.ids.length === 2), "the week's charts are named images too");
    out.week_bars = week.bars.length;
    await page.screenshot({ path: join(shots, "activity-week.png"), fullPage: true });
    await page.goBack();
    await page.waitForURL((u) => u.pathname === "/activity" && !u.searchParams.has("span"));
    const back = await readSection("tenant-activity");
    expect(back.bars.length === 24, `back on the day: 24 bars; found ${back.bars.length}`);
  }

  step = "connection activity";
  {
    const seen = await pollUntilCounted(connectionUrl, "connection-activity", connectionBase);
    checkSection(seen, connectionBase, { perConnection: true, bars: 24 });
    expect(seen.spanLink?.href === `/connections/${connection}?span=week`, `the connection's span link stays on the connection: ${json(seen.spanLink)}`);
    out.connection_read = seriesOf(seen, "read") - connectionBase.series.read;
    out.connection_notify = seriesOf(seen, "notify") - connectionBase.series.notify;
    out.connection_refusals = Object.fromEntries(Object.keys(ADDED_REFUSALS).map((c) => [c, refusalsOf(seen)[c] - (connectionBase.refusals[c] ?? 0)]));
    await page.screenshot({ path: join(shots, "connection-activity.png"), fullPage: true });
    await page.locator("#connection-activity").getByRole("link", { name: "Show the last 7 days" }).click();
    await page.waitForURL(/span=week/);
    const week = await readSection("connection-activity");
    expect(new URL(page.url()).pathname === `/connections/${connection}` && week.bars.length === 28, `the connection's week: 28 bars on /connections/${connection}; ${week.bars.length} on ${page.url()}`);
  }

  step = "the JSON";
  expect(out.read === ADDED.read && out.notify === ADDED.notify, `read ${out.read}, notify ${out.notify}`);
  expect(json(out.refusals) === json(ADDED_REFUSALS), `refusals ${json(out.refusals)}`);
  expect(out.connection_read === ADDED.read && out.connection_notify === ADDED.notify, `connection read ${out.connection_read}, notify ${out.connection_notify}`);
  expect(out.week_bars === 28 && out.drawn_pixels > 0, `week_bars ${out.week_bars}, drawn_pixels ${out.drawn_pixels}`);
  out.shots = ["activity.png", "activity-calls-chart.png", "activity-week.png", "connection-activity.png"].map((f) => join(shots, f));

  console.log(JSON.stringify(out));
  await browser.close();
} catch (error) {
  const file = join(shots, `failure-${step.replace(/\W+/g, "-")}.png`);
  await page.screenshot({ path: file, fullPage: true }).catch(() => {});
  console.error(`${error.message}\nscreenshot: ${file}\nurl: ${page.url()}`);
  await browser.close();
  process.exit(1);
}
