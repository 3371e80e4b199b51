// Number, money and time formatting for the dashboard. Counts that the API
// sends as strings (uint64, int64) stay strings: they are grouped digit by
// digit, never rounded through a float. Times are shown in UTC, as the API
// and the capacity report's heat map count them.

const nf = (opts) => new Intl.NumberFormat("en-US", opts);
const fmt0 = nf({ maximumFractionDigits: 0 });
const fmt1 = nf({ maximumFractionDigits: 1 });
const fmt2 = nf({ maximumFractionDigits: 2 });
const fmt3sig = nf({ maximumSignificantDigits: 3 });

// count formats an integer given as a number or a decimal string with
// thousands separators, exactly.
export function count(v) {
  if (v === undefined || v === null || v === "") return "0";
  let s = String(v);
  let sign = "";
  if (s.startsWith("-")) {
    sign = "-";
    s = s.slice(1);
  }
  if (!/^\d+$/.test(s)) return sign + fmt0.format(Number(s));
  return sign + s.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

// num formats a measured value with sensible precision: whole numbers for
// large values, up to two decimals for small ones, three significant
// digits below 1.
export function num(x) {
  if (x === undefined || x === null || Number.isNaN(x)) return "–";
  const a = Math.abs(x);
  if (a >= 1000) return fmt0.format(x);
  if (a >= 100) return fmt1.format(x);
  if (a >= 1 || a === 0) return fmt2.format(x);
  return fmt3sig.format(x);
}

// compact formats an axis value: 1.2k, 3.4M, 5G.
export function compact(x) {
  const a = Math.abs(x);
  const units = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  for (const [v, u] of units) {
    if (a >= v) return trimZeros((x / v).toFixed(a / v >= 100 ? 0 : 1)) + u;
  }
  return num(x);
}

function trimZeros(s) {
  return s.includes(".") ? s.replace(/\.?0+$/, "") : s;
}

// decimals is how many decimal places write step exactly (0.025: 3;
// 2.5: 1; 500: 0), at most 12.
export function decimals(step) {
  if (!(step > 0) || !Number.isFinite(step)) return 0;
  const [mant, exp] = step.toExponential(12).split("e");
  const frac = mant.split(".")[1].replace(/0+$/, "");
  return Math.min(12, Math.max(0, frac.length - Number(exp)));
}

// tick formats one tick of an axis whose ticks are multiples of step, so
// that each label is its tick's value exactly and no two ticks read alike:
// as compact, but with the decimals the step needs (a step of 250 reads
// 1.25k, not 1.3k). kind "percent" shows ratios in percent (a step of
// 0.025 reads 0 %, 2.5 %, 5 %, 7.5 %); kind "money" prefixes or suffixes
// the currency cur ("$1.5k", "12 XYZ").
export function tick(x, step, kind = "number", cur = "") {
  if (kind === "percent") return fixedTrim(x * 100, decimals(step * 100)) + " %";
  let text;
  const a = Math.abs(x);
  const units = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  const unit = units.find(([v]) => a >= v);
  if (unit) text = fixedTrim(x / unit[0], decimals(step / unit[0])) + unit[1];
  else text = fixedTrim(x, decimals(step));
  if (kind === "money") {
    const { prefix, suffix } = currencyAffix(cur);
    const neg = text.startsWith("-");
    return (neg ? "-" : "") + prefix + (neg ? text.slice(1) : text) + suffix;
  }
  return text;
}

// fixedTrim writes x with at most d decimals and thousands separators,
// without trailing zeros.
function fixedTrim(x, d) {
  const s = nf({ minimumFractionDigits: 0, maximumFractionDigits: d, useGrouping: true }).format(Number(x.toFixed(d)));
  return s === "-0" ? "0" : s;
}

// currencyAffix is how money in cur is marked around a number, as money()
// writes it: "$" before it, "XYZ " before it for a code without a symbol,
// or the code after the number when Intl does not take the code.
export function currencyAffix(cur) {
  const code = cur || "USD";
  try {
    const parts = nf({ style: "currency", currency: code }).formatToParts(1);
    const num = (p) => ["integer", "group", "decimal", "fraction"].includes(p.type);
    const first = parts.findIndex(num);
    const last = parts.length - 1 - [...parts].reverse().findIndex(num);
    const text = (ps) => ps.map((p) => p.value).join("");
    return { prefix: text(parts.slice(0, first)), suffix: text(parts.slice(last + 1)) };
  } catch {
    return { prefix: "", suffix: " " + code };
  }
}

// ms formats a latency in milliseconds: "85.2 ms", "1.25 s".
export function ms(x) {
  if (x === undefined || x === null || Number.isNaN(x)) return "–";
  if (Math.abs(x) >= 1000) return fmt2.format(x / 1000) + " s";
  return num(x) + " ms";
}

// pct formats a ratio (0.9951) as a percentage ("99.51 %").
export function pct(x, digits = 2) {
  if (x === undefined || x === null || Number.isNaN(x)) return "–";
  return (x * 100).toFixed(digits) + " %";
}

// rate formats a per-second rate: "1,234 /s".
export function rate(x, unit = "/s") {
  return num(x) + " " + unit;
}

// money formats an exact decimal amount (a string such as "12.345000000")
// in currency cur, rounded for display to cents, or to three significant
// digits below one cent.
export function money(amount, cur) {
  const x = Number(amount || 0);
  const a = Math.abs(x);
  let opts = { minimumFractionDigits: 2, maximumFractionDigits: 2 };
  if (a > 0 && a < 0.01) opts = { maximumSignificantDigits: 3 };
  try {
    return nf({ style: "currency", currency: cur || "USD", ...opts }).format(x);
  } catch {
    // Not an ISO 4217 code that Intl knows: show the code after the number.
    return nf(opts).format(x) + " " + (cur || "");
  }
}

// moneyNum is an amount as a number, for drawing only.
export function moneyNum(m) {
  return m && m.amount ? Number(m.amount) : 0;
}

// nanosSum adds Money values exactly (BigInt nanos) and returns the sum as
// a Money value.
export function moneySum(list, cur) {
  let n = 0n;
  for (const m of list) {
    if (m && m.nanos) n += BigInt(m.nanos);
  }
  return { currency: cur, nanos: n.toString(), amount: nanosAmount(n) };
}

// nanosAmount writes BigInt nanos as a decimal with nine decimals.
export function nanosAmount(n) {
  const neg = n < 0n;
  const a = neg ? -n : n;
  const s = a.toString().padStart(10, "0");
  return (neg ? "-" : "") + s.slice(0, -9) + "." + s.slice(-9);
}

const months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
const p2 = (n) => String(n).padStart(2, "0");

// time formats an instant (ms since the epoch) in UTC at the precision of
// the step: "14:05", "12 Mar 14:00", "12 Mar".
export function time(t, step = "hour") {
  const d = new Date(t);
  const day = `${d.getUTCDate()} ${months[d.getUTCMonth()]}`;
  const hm = `${p2(d.getUTCHours())}:${p2(d.getUTCMinutes())}`;
  if (step === "minute") return `${day} ${hm}`;
  if (step === "day") return `${day} ${d.getUTCFullYear()}`;
  return `${day} ${hm}`;
}

// isoHour writes an instant as "2026-03-12T14:00" (UTC), the value of a
// datetime-local input.
export function inputValue(t) {
  return new Date(t).toISOString().slice(0, 16);
}

// rangeText describes a range: "12 Mar 14:00 – 13 Mar 14:00 UTC".
export function rangeText(start, end) {
  return `${time(start)} – ${time(end)} UTC`;
}

export const weekdays = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
