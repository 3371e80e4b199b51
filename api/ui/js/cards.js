// Summary cards. Every shown number carries its raw value from the API in
// data-value (integers as the API's decimal strings, ratios and rates as
// numbers, money as the exact decimal amount), under a stable name in
// data-card, so that tests compare the page with the API exactly.

function el(tag, cls, text, parent) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (parent) parent.appendChild(e);
  return e;
}

function valueEl(tag, cls, name, raw, text, parent) {
  const e = el(tag, cls, text, parent);
  e.dataset.card = name;
  e.dataset.value = raw === undefined || raw === null ? "" : String(raw);
  return e;
}

// card adds a card with one big value: {name, title, raw, text, sub?}.
export function card(parent, c) {
  const box = el("div", "card" + (c.wide ? " wide" : ""), null, parent);
  el("h3", null, c.title, box);
  valueEl("div", "big", c.name, c.raw, c.text, box);
  if (c.sub) el("div", "sub", c.sub, box);
  return box;
}

// trio adds a card with three labelled values, such as p50, p95 and p99:
// {title, items: [{name, label, raw, text}], sub?}. It is two columns wide.
export function trio(parent, c) {
  const box = el("div", "card wide trio-card", null, parent);
  el("h3", null, c.title, box);
  const g = el("div", "trio", null, box);
  for (const it of c.items) el("span", "l", it.label, g);
  for (const it of c.items) valueEl("span", "v", it.name, it.raw, it.text, g);
  if (c.sub) el("div", "sub", c.sub, box);
  return box;
}

// stat adds a card with one big value and smaller ones beneath it, such
// as a p50 with its p95 and p99: {title, main: {name, label, raw, text},
// more: [{name, label, raw, text}], sub?}. Each value carries data-card
// and data-value as card's does.
export function stat(parent, c) {
  const box = el("div", "card stat-card", null, parent);
  el("h3", null, c.title, box);
  const big = el("div", "big-line", null, box);
  valueEl("span", "big", c.main.name, c.main.raw, c.main.text, big);
  if (c.main.label) el("span", "l", c.main.label, big);
  const more = el("div", "more", null, box);
  for (const it of c.more || []) {
    const item = el("span", "item", null, more);
    el("span", "l", it.label, item);
    valueEl("span", "v", it.name, it.raw, it.text, item);
  }
  if (c.sub) el("div", "sub", c.sub, box);
  return box;
}

// MIN_FONT is the smallest size (px) fitValues shrinks a value to; a value
// still too wide then wraps.
const MIN_FONT = 12;

// fitValues makes every card value under root fit its card: a value wider
// than its box (a long amount, "1,234.56 ms" three abreast) is set in a
// smaller font, down to MIN_FONT, then wrapped. It measures, so it runs
// once the cards are on the page and the charts drawn (the page's scroll
// bar takes width), and again when the window's width changes.
export function fitValues(root) {
  for (const e of root.querySelectorAll(".card .big, .card .trio .v, .card .more .v")) {
    e.style.fontSize = "";
    e.classList.remove("wrap");
    if (!e.clientWidth) continue; // not shown
    let size = parseFloat(getComputedStyle(e).fontSize);
    while (e.scrollWidth > e.clientWidth && size > MIN_FONT) {
      size -= 1;
      e.style.fontSize = `${size}px`;
    }
    if (e.scrollWidth > e.clientWidth) e.classList.add("wrap");
  }
}

// panelError shows a failure inside a panel, in place of what it would
// have drawn.
export function panelError(parent, text) {
  const e = el("div", "panel-error", text, parent);
  e.setAttribute("role", "alert");
  return e;
}

// table adds a data table: head is the column titles, rows arrays of cell
// texts; a cell given as {text, raw, name} carries data attributes.
export function table(parent, caption, head, rows) {
  const wrap = el("div", "table-wrap", null, parent);
  const t = el("table", "data", null, wrap);
  el("caption", null, caption, t);
  const hr = el("tr", null, null, el("thead", null, null, t));
  for (const h of head) {
    const th = el("th", null, h, hr);
    th.scope = "col";
  }
  const tb = el("tbody", null, null, t);
  for (const r of rows) {
    const tr = el("tr", null, null, tb);
    for (const c of r) {
      if (c && typeof c === "object") {
        const td = el("td", null, c.text, tr);
        if (c.name) td.dataset.cell = c.name;
        if (c.raw !== undefined) td.dataset.value = String(c.raw);
      } else {
        el("td", null, c, tr);
      }
    }
  }
  return wrap;
}
