// The kvtier dashboard. It polls the admin API's stats endpoint and
// renders each answer into the page; rates (hit rate per poll, bytes per
// second) come from the difference between two consecutive answers.
//
// There is no framework: index.html holds the fixed parts of the page and
// two <template>s, a tier card and a queue row, cloned once per tier. Every
// number goes into an element marked with data-field (and data-tier,
// data-queue or data-group), which keeps the exact value in data-value;
// the element's data-format says how to show it.
"use strict";

(() => {
  const HISTORY = 120; // polls the charts show
  const DEFAULT_INTERVAL_MS = 1000;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const root = document.documentElement;

  // ---- formatting ---------------------------------------------------------

  const BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

  function formatBytes(n) {
    let unit = 0;
    while (Math.abs(n) >= 1024 && unit < BYTE_UNITS.length - 1) {
      n /= 1024;
      unit++;
    }
    return unit === 0 ? `${Math.round(n)} B` : `${n.toFixed(1)} ${BYTE_UNITS[unit]}`;
  }

  // Counters are JSON numbers: exact in JavaScript up to 2^53, which no
  // counter of a running daemon reaches.
  function formatCount(n) {
    return String(Math.round(n)).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  }

  const FORMATS = {
    bytes: formatBytes,
    count: formatCount,
    ratio: (r) => `${(r * 100).toFixed(1)}%`,
    rate: (n) => `${formatBytes(n)}/s`,
    text: String,
  };

  function formatInterval(ms) {
    if (ms >= 60000 && ms % 60000 === 0) return `${ms / 60000} min`;
    return ms % 1000 === 0 ? `${ms / 1000} s` : `${ms} ms`;
  }

  // ---- configuration ------------------------------------------------------

  // readConfig takes the stats URL and the polling interval from the query
  // string, falling back to the API root the server wrote into the page.
  function readConfig() {
    const params = new URLSearchParams(location.search);
    const fallback = `${document.body.dataset.apiRoot || ""}api/v1/stats`;
    const url = new URL(params.get("api") || fallback, document.baseURI);
    if (url.origin !== location.origin) {
      throw new Error(`the api parameter must name this page's origin, not ${url.origin}`);
    }
    let interval = Number(params.get("interval") || DEFAULT_INTERVAL_MS);
    if (!Number.isFinite(interval)) interval = DEFAULT_INTERVAL_MS;
    interval = Math.min(Math.max(Math.round(interval), 200), 60000);
    return { url, interval };
  }

  // ---- showing values -----------------------------------------------------

  // show puts value into el: exact in data-value, formatted as text. A null
  // value (a ratio of nothing, say) shows as a dash with an empty data-value.
  function show(el, value) {
    if (!el) return;
    const format = FORMATS[el.dataset.format] || FORMATS.text;
    el.dataset.value = value === null ? "" : String(value);
    el.textContent = value === null ? "–" : format(value);
  }

  // fieldsIn maps each data-field name under container to its element.
  function fieldsIn(container, selector = "[data-field]") {
    const fields = new Map();
    for (const el of container.querySelectorAll(selector)) fields.set(el.dataset.field, el);
    return fields;
  }

  function showAll(fields, values) {
    for (const [name, el] of fields) {
      if (name in values) show(el, values[name]);
    }
  }

  function ratio(part, rest) {
    return part + rest > 0 ? part / (part + rest) : null;
  }

  // setBar sizes a usage bar: used (and, when given, the pinned share of
  // it) against capacity. A tier without a capacity gets an empty bar.
  function setBar(bar, used, capacity, pinned = 0) {
    if (!bar) return;
    const pct = (n) => (capacity > 0 ? Math.min(100, (100 * n) / capacity) : 0);
    bar.querySelector(".used").style.width = `${pct(Math.max(used - pinned, 0))}%`;
    const pinnedEl = bar.querySelector(".pinned");
    if (pinnedEl) pinnedEl.style.width = `${pct(pinned)}%`;
    bar.classList.toggle("unbounded", !(capacity > 0));
    bar.classList.toggle("full", capacity > 0 && used / capacity >= 0.95);
    bar.setAttribute("role", "meter");
    bar.setAttribute("aria-valuemin", "0");
    bar.setAttribute("aria-valuemax", String(Math.max(capacity, 0)));
    bar.setAttribute("aria-valuenow", String(used));
  }

  // ---- overview, tiers, queues, arena ------------------------------------

  // overall counts the hierarchy's reads. Every read starts in RAM (the
  // first tier), so RAM's hits and misses count the reads; a chunk RAM
  // missed and a lower tier held counts as a hit there. Lower tiers are
  // probed without counting misses, so their misses cannot be used. The
  // tier manager counts a RAM miss per batch and again per key it tries
  // to promote, so this slightly understates the hit rate when lower
  // tiers serve.
  function overall(tiers) {
    const served = tiers.reduce((sum, t) => sum + t.hits, 0);
    const reads = tiers.length > 0 ? tiers[0].hits + tiers[0].misses : 0;
    return { served, reads };
  }

  // overallRate is the share of reads some tier served.
  function overallRate(served, reads) {
    return reads > 0 ? Math.min(1, served / reads) : null;
  }

  const overviewFields = fieldsIn(document, '[data-group="overall"]');
  const arenaFields = fieldsIn(document, '[data-group="arena"][data-field]');

  function renderOverview(stats) {
    const { served, reads } = overall(stats.tiers);
    showAll(overviewFields, { served, reads, hit_rate: overallRate(served, reads), promoted: stats.promoted });
  }

  function renderArena(arena) {
    showAll(arenaFields, { ...arena, used_ratio: arena.capacity_bytes > 0 ? arena.used_bytes / arena.capacity_bytes : null });
    setBar(document.querySelector('[data-group="arena"][data-bar]'), arena.used_bytes, arena.capacity_bytes, arena.pinned_bytes);
  }

  // keyedList keeps one element per name, cloned from a template, in the
  // order of the latest answer: tiers can come and go between restarts.
  function keyedList(container, templateId, attribute) {
    const template = document.getElementById(templateId);
    const items = new Map();
    return function update(names) {
      const wanted = new Set(names);
      for (const [name, item] of items) {
        if (!wanted.has(name)) {
          item.el.remove();
          items.delete(name);
        }
      }
      return names.map((name) => {
        let item = items.get(name);
        if (!item) {
          const el = template.content.firstElementChild.cloneNode(true);
          el.setAttribute(attribute, name);
          for (const marked of el.querySelectorAll("[data-field], [data-bar]")) marked.setAttribute(attribute, name);
          item = { el, fields: fieldsIn(el), bar: el.querySelector("[data-bar]") };
          items.set(name, item);
        }
        container.append(item.el); // moves it into place; cheap when already there
        return item;
      });
    };
  }

  const tierCards = keyedList(document.getElementById("tier-list"), "tier-card", "data-tier");
  const queueRows = keyedList(document.getElementById("queue-rows"), "queue-row", "data-queue");

  function renderTiers(tiers) {
    tierCards(tiers.map((t) => t.name)).forEach((card, i) => {
      const t = tiers[i];
      showAll(card.fields, {
        ...t,
        hit_rate: ratio(t.hits, t.misses),
        used_ratio: t.capacity_bytes > 0 ? t.used_bytes / t.capacity_bytes : null,
      });
      setBar(card.bar, t.used_bytes, t.capacity_bytes, t.pinned_bytes);
    });
  }

  function renderQueues(queues) {
    queueRows(queues.map((q) => q.tier)).forEach((row, i) => {
      const q = queues[i];
      showAll(row.fields, q);
      setBar(row.bar, q.depth, q.capacity);
      row.fields.get("dropped").classList.toggle("warn", q.dropped > 0);
      row.fields.get("failed").classList.toggle("warn", q.failed > 0);
    });
    document.getElementById("queues-empty").hidden = queues.length > 0;
  }

  // ---- history and charts -------------------------------------------------

  const OVERALL_LABEL = "all tiers";
  const MIN_RATE_SCALE = 1024; // bytes/s at the top of an idle throughput chart
  const samples = []; // one per poll after the first, oldest first
  let previous = null; // { at, stats } of the last answer

  // record turns the counters of two consecutive answers into one sample
  // of rates. A tier whose counters went down (the daemon restarted) or
  // that is new gets no rate until the next poll.
  function record(stats, at) {
    if (previous && at > previous.at) {
      const seconds = (at - previous.at) / 1000;
      const before = new Map(previous.stats.tiers.map((t) => [t.name, t]));
      const sample = { hit: new Map(), read: new Map(), write: new Map(), overall: null };
      for (const t of stats.tiers) {
        const p = before.get(t.name);
        if (!p || ["hits", "misses", "bytes_read", "bytes_written"].some((k) => t[k] < p[k])) continue;
        sample.hit.set(t.name, ratio(t.hits - p.hits, t.misses - p.misses));
        sample.read.set(t.name, (t.bytes_read - p.bytes_read) / seconds);
        sample.write.set(t.name, (t.bytes_written - p.bytes_written) / seconds);
      }
      const now = overall(stats.tiers);
      const then = overall(previous.stats.tiers);
      if (now.served >= then.served && now.reads >= then.reads) {
        sample.overall = overallRate(now.served - then.served, now.reads - then.reads);
      }
      samples.push(sample);
      if (samples.length > HISTORY) samples.shift();
    }
    previous = { at, stats };
  }

  function drawCharts(tiers) {
    // A tier keeps its colour in every chart; the overall line has its own.
    const series = (key) =>
      tiers.map((t, i) => ({ name: t.name, colour: `s${i % 6}`, values: samples.map((s) => s[key].get(t.name) ?? null) }));
    const hit = [{ name: OVERALL_LABEL, colour: "s-all", values: samples.map((s) => s.overall) }, ...series("hit")];
    drawChart(document.getElementById("chart-hit-rate"), hit, 1, "ratio");
    for (const [id, key] of [["chart-read", "read"], ["chart-write", "write"]]) {
      const lines = series(key);
      const peak = Math.max(MIN_RATE_SCALE, ...lines.flatMap((l) => l.values.filter((v) => v !== null)));
      drawChart(document.getElementById(id), lines, niceBytes(peak), "rate");
    }
  }

  // niceBytes rounds n up to 1, 2 or 5 times a power of ten of a binary
  // unit, so the axis reads "20.0 MiB/s" rather than "17.3 MiB/s".
  function niceBytes(n) {
    let unit = 1;
    while (n / unit >= 1000 && unit < 1024 ** 6) unit *= 1024;
    for (const step of [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]) {
      if (n <= step * unit) return step * unit;
    }
    return 1024 * unit;
  }

  const PLOT = { width: 400, height: 150, left: 66, right: 6, top: 8, bottom: 8 };

  function svg(name, attrs, text) {
    const el = document.createElementNS(SVG_NS, name);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
    if (text !== undefined) el.textContent = text;
    return el;
  }

  // drawChart draws each series as a line over the last HISTORY polls, the
  // newest at the right edge; a null value breaks the line.
  function drawChart(figure, series, max, format) {
    const plotW = PLOT.width - PLOT.left - PLOT.right;
    const plotH = PLOT.height - PLOT.top - PLOT.bottom;
    const x = (i, n) => PLOT.left + ((i + HISTORY - n) * plotW) / (HISTORY - 1);
    const y = (v) => PLOT.top + (1 - Math.min(v, max) / max) * plotH;
    const parts = [];
    for (const level of [0, 0.5, 1]) {
      const at = y(level * max);
      parts.push(svg("line", { class: "grid", x1: PLOT.left, x2: PLOT.width - PLOT.right, y1: at, y2: at }));
      parts.push(svg("text", { class: "axis", x: PLOT.left - 6, y: at + 4, "text-anchor": "end" }, FORMATS[format](level * max)));
    }
    for (const s of series) {
      let d = "";
      let pen = "M";
      s.values.forEach((v, j) => {
        if (v === null) {
          pen = "M";
          return;
        }
        d += `${pen}${x(j, s.values.length).toFixed(1)} ${y(v).toFixed(1)}`;
        pen = "L";
      });
      if (d) parts.push(svg("path", { class: `line ${s.colour}`, d, "data-series": s.name }));
    }
    figure.querySelector("svg").replaceChildren(...parts);
    drawLegend(figure.querySelector(".legend"), series, format);
  }

  function drawLegend(list, series, format) {
    const items = series.map((s) => {
      const li = document.createElement("li");
      li.dataset.series = s.name;
      const swatch = document.createElement("span");
      swatch.className = `swatch ${s.colour}`;
      const value = document.createElement("span");
      value.dataset.field = "latest";
      value.dataset.format = format;
      value.className = "value";
      show(value, s.values.length > 0 ? s.values[s.values.length - 1] : null);
      li.append(swatch, ` ${s.name} `, value);
      return li;
    });
    list.replaceChildren(...items);
  }

  // ---- the admin token -----------------------------------------------------

  // With admin_token set, the reads need "Authorization: Bearer <token>".
  // The token is kept in sessionStorage, which this tab alone reads and
  // which is gone when it closes. It arrives either from the form shown
  // after a 401, or once in the page's fragment (#token=...), which the
  // browser never sends to the server and the script removes from the
  // address bar at once.
  const TOKEN_KEY = "kvtier-admin-token";
  const authForm = document.getElementById("auth");
  const authInput = document.getElementById("auth-token");

  function takeTokenFromFragment() {
    const params = new URLSearchParams(location.hash.slice(1));
    const token = params.get("token");
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    history.replaceState(null, "", location.pathname + location.search);
  }

  function authHeaders() {
    const token = sessionStorage.getItem(TOKEN_KEY);
    return token ? { Authorization: `Bearer ${token}` } : {};
  }

  // askForToken stops polling until a token is entered.
  function askForToken() {
    sessionStorage.removeItem(TOKEN_KEY);
    root.dataset.auth = "required";
    authForm.hidden = false;
    setStatus("error", "The admin API wants its token (admin_token).");
  }

  authForm.addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, authInput.value);
    authInput.value = "";
    authForm.hidden = true;
    delete root.dataset.auth;
    if (!inFlight && !timer) poll();
  });

  // ---- polling ------------------------------------------------------------

  const statusEl = document.getElementById("status");
  const pauseButton = document.getElementById("pause");
  let config = null;
  let timer = 0;
  let inFlight = false;
  let paused = false;
  let polls = 0;

  function setStatus(state, text) {
    statusEl.dataset.state = state;
    statusEl.textContent = text;
  }

  function render(stats, at) {
    renderOverview(stats);
    renderTiers(stats.tiers);
    renderQueues(stats.queues);
    renderArena(stats.arena);
    record(stats, at);
    drawCharts(stats.tiers);
    polls++;
    root.dataset.polls = String(polls);
    root.dataset.ok = "true";
  }

  async function poll() {
    timer = 0;
    inFlight = true;
    try {
      const res = await fetch(config.url, {
        cache: "no-store",
        headers: { Accept: "application/json", ...authHeaders() },
      });
      if (res.status === 401) {
        askForToken();
        return;
      }
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      render(await res.json(), performance.now());
      setStatus("ok", `Updated ${new Date().toLocaleTimeString()}, every ${formatInterval(config.interval)}`);
    } catch (err) {
      console.error("kvtier dashboard:", err);
      setStatus("error", `Cannot read ${config.url.pathname}: ${err.message}. Retrying.`);
    } finally {
      inFlight = false;
      if (!root.dataset.auth) schedule();
    }
  }

  function schedule() {
    if (!paused && !inFlight && !timer) timer = setTimeout(poll, config.interval);
  }

  function togglePause() {
    paused = !paused;
    pauseButton.textContent = paused ? "Resume" : "Pause";
    pauseButton.setAttribute("aria-pressed", String(paused));
    if (paused) {
      clearTimeout(timer);
      timer = 0;
      setStatus("paused", "Paused");
      return;
    }
    previous = null; // a rate across the pause would smear it over one sample
    if (!inFlight) poll();
  }

  window.addEventListener("error", (e) => {
    root.dataset.error = e.message;
    setStatus("error", `Dashboard script error: ${e.message}`);
  });

  takeTokenFromFragment();
  try {
    config = readConfig();
  } catch (err) {
    root.dataset.error = err.message;
    setStatus("error", `Cannot start: ${err.message}`);
    return;
  }
  document.getElementById("chart-window").textContent =
    `(last ${HISTORY} polls, ${formatInterval(HISTORY * config.interval)})`;
  pauseButton.addEventListener("click", togglePause);
  poll();
})();
