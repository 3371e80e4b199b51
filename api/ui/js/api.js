// The dashboard's client of the REST API: every call carries the key as a
// bearer token, answers are the proto JSON of the API (proto field names,
// 64-bit integers as strings, RFC 3339 times), and failures become ApiError
// values with a message a person can act on. Expected HTTP errors are shown
// on the page, never logged to the console.

const KEY = "tokenmeter.key";

// Key storage: one browser tab's session only.
export const keyStore = {
  get: () => sessionStorage.getItem(KEY) || "",
  set: (k) => sessionStorage.setItem(KEY, k),
  clear: () => sessionStorage.removeItem(KEY),
};

// ApiError is a failed call: status is the HTTP status (0: no answer).
export class ApiError extends Error {
  constructor(status, message, path) {
    super(message);
    this.status = status;
    this.path = path;
  }

  // explain is the message shown on the page.
  explain() {
    switch (this.status) {
      case 0:
        return `The API did not answer (${this.message}). Check that meterd is running, then reload.`;
      case 401:
        return `The API key was not accepted: ${this.message}. Sign out and enter a valid key.`;
      case 403:
        return `This key may not read this: ${this.message}.`;
      case 404:
        return `Not found: ${this.message}.`;
      default:
        return `The API answered ${this.status}: ${this.message}.`;
    }
  }
}

// query writes params as a query string; arrays repeat the parameter, empty
// values are left out.
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v === undefined || v === null || v === "") continue;
    if (Array.isArray(v)) v.forEach((x) => q.append(k, x));
    else q.append(k, String(v));
  }
  const s = q.toString();
  return s ? "?" + s : "";
}

// request calls the API with the key and returns the response, or throws an
// ApiError with the API's own message ({"code":..,"message":..}).
export async function request(key, path, params) {
  const url = path + query(params);
  let res;
  try {
    res = await fetch(url, { headers: { Authorization: "Bearer " + key }, cache: "no-store" });
  } catch (e) {
    throw new ApiError(0, e.message || String(e), path);
  }
  if (!res.ok) {
    let msg = res.statusText || "error";
    try {
      const body = await res.json();
      if (body && body.message) msg = body.message;
    } catch {
      // Not JSON (a proxy's page): keep the status text.
    }
    throw new ApiError(res.status, msg, path);
  }
  return res;
}

// get returns the JSON answer of a GET.
export async function get(key, path, params) {
  const res = await request(key, path, params);
  return res.json();
}

// series returns every series of a paged answer (metrics, cost, GPU usage),
// following next_page_token, with the first page's other fields.
export async function series(key, path, params) {
  let token = "";
  let first = null;
  const all = [];
  for (let i = 0; i < 100; i++) {
    const page = await get(key, path, { ...params, page_size: 1000, page_token: token });
    if (!first) first = page;
    all.push(...(page.series || []));
    token = page.next_page_token || "";
    if (!token) break;
  }
  return { ...first, series: all, next_page_token: "" };
}

// ts is an RFC 3339 time as milliseconds since the epoch.
export const ts = (s) => (s ? Date.parse(s) : NaN);

const MIN = 60e3;
const HOUR = 3600e3;
const DAY = 24 * HOUR;

export const spans = { "1h": HOUR, "24h": DAY, "7d": 7 * DAY, "30d": 30 * DAY };

// stepFor picks the step of a range's series: minutes up to two hours,
// hours up to seven days, days beyond.
export function stepFor(start, end) {
  const d = end - start;
  if (d <= 2 * HOUR) return "minute";
  if (d <= 7 * DAY) return "hour";
  return "day";
}

const floorTo = (t, u) => Math.floor(t / u) * u;
const ceilTo = (t, u) => Math.ceil(t / u) * u;

// resolveRange turns the picker's choice into the ranges of the calls. The
// metrics routes take whole minutes: a relative range ends at the next whole
// minute. Cost and GPU usage are computed per hour: their range is the
// whole hours that cover it. A custom range is whole hours, so both agree.
export function resolveRange(choice, customStart, customEnd, now = Date.now()) {
  let start;
  let end;
  if (choice === "custom") {
    start = floorTo(customStart, HOUR);
    end = floorTo(customEnd, HOUR);
    if (!(end > start)) throw new Error("The custom range needs an end after its start (whole hours, UTC).");
  } else {
    // Ranges longer than two hours end at the end of the current hour, so
    // that every query reads the hour rollups: a range ending mid-hour
    // reads minute rows for all of it (on 1,000 tenants, a day took the
    // metrics calls 2-5 s instead of tens of milliseconds). The last hour
    // is the one in progress, counted up to now.
    const span = spans[choice] || DAY;
    end = span > 2 * HOUR ? ceilTo(now + 1, HOUR) : ceilTo(now + 1, MIN);
    start = end - span;
  }
  const step = stepFor(start, end);
  return {
    start,
    end,
    step,
    now,
    hourStart: floorTo(start, HOUR),
    hourEnd: ceilTo(end, HOUR),
    // Cost and GPU usage have no minute step.
    hourStep: step === "minute" ? "hour" : step,
  };
}

// partial is the bucket of a step ("minute", "hour", "day") still in
// progress at now: {t, label}, where t is its start (UTC) and label names
// it ("partial hour"). Rates over it count a part of the step only.
export function partial(step, now = Date.now()) {
  const name = ["minute", "hour", "day"].includes(step) ? step : "hour";
  return { t: floorTo(now, { minute: MIN, hour: HOUR, day: DAY }[name]), label: `partial ${name}` };
}

export const iso = (t) => new Date(t).toISOString().replace(".000Z", "Z");
