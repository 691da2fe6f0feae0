/* Helpers shared by the console's pages: requests with the CSRF token, formatting,
 * SVG elements, and the level colour scale (NiFi's back-pressure bar: green below
 * LEVEL_WARN, amber below LEVEL_BAD, red above). The thresholds live here only: pages
 * label their legends with levelBandText and draw their grids at the same values; the
 * colours are console.css's --ok, --warn and --bad. No framework, no CDN: this file
 * ships with the project. */
(function (global) {
  "use strict";

  const SVG_NS = "http://www.w3.org/2000/svg";
  const LEVEL_WARN = 0.6;
  const LEVEL_BAD = 0.85;

  function cookie(name) {
    const match = document.cookie.match(new RegExp("(?:^|; )" + name + "=([^;]*)"));
    return match ? decodeURIComponent(match[1]) : "";
  }

  async function api(method, url, body) {
    const options = {
      method: method,
      credentials: "same-origin",
      headers: { "Accept": "application/json", "X-CSRFToken": cookie("csrftoken") },
    };
    if (body !== undefined) {
      options.headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(body);
    }
    const response = await fetch(url, options);
    let data = null;
    try { data = await response.json(); } catch (e) { data = null; }
    return { ok: response.ok, status: response.status, data: data };
  }

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : v);
    }
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== null && v !== undefined) node.setAttribute(k, v);
    }
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  function levelClass(level) {
    if (level === null || level === undefined || isNaN(level)) return "level-none";
    if (level >= LEVEL_BAD) return "level-bad";
    if (level >= LEVEL_WARN) return "level-warn";
    return "level-ok";
  }

  // The legend's text of a level band ("ok", "warn", "bad"), from the thresholds above.
  function levelBandText(band) {
    const warn = Math.round(100 * LEVEL_WARN) + "%";
    const bad = Math.round(100 * LEVEL_BAD) + "%";
    return { ok: "< " + warn, warn: warn + "–" + bad, bad: "≥ " + bad }[band] || "";
  }

  // Fill every [data-level-band] element under root with its band's text.
  function labelLevelBands(root) {
    for (const node of (root || document).querySelectorAll("[data-level-band]")) {
      node.textContent = levelBandText(node.getAttribute("data-level-band"));
    }
  }

  function pct(x, digits) {
    if (x === null || x === undefined || isNaN(x)) return "–";
    return (100 * x).toFixed(digits === undefined ? 0 : digits) + "%";
  }

  function bytes(n) {
    if (n === null || n === undefined || isNaN(n)) return "–";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    let v = Number(n);
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? v.toFixed(0) : v.toFixed(v < 10 ? 2 : 1)) + " " + units[i];
  }

  function rate(bytesPerSecond) {
    if (bytesPerSecond === null || bytesPerSecond === undefined || isNaN(bytesPerSecond)) return "–";
    return bytes(bytesPerSecond) + "/s";
  }

  // A count with a thousands unit: 61440 -> "61.4 k", 2500000 -> "2.50 M".
  function count(n) {
    if (n === null || n === undefined || isNaN(n)) return "–";
    const v = Number(n);
    if (Math.abs(v) >= 1e6) return (v / 1e6).toFixed(2) + " M";
    if (Math.abs(v) >= 1e3) return (v / 1e3).toFixed(1) + " k";
    return v.toFixed(0);
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined || isNaN(seconds)) return "–";
    const s = Math.max(0, Math.round(seconds));
    const m = Math.floor(s / 60);
    const h = Math.floor(m / 60);
    const two = (x) => String(x).padStart(2, "0");
    return (h ? h + ":" + two(m % 60) : m) + ":" + two(s % 60);
  }

  function clock(iso) {
    const d = new Date(iso);
    if (isNaN(d.getTime())) return "";
    return d.toLocaleTimeString([], { hour12: false });
  }

  // What waits outside an unbounded source (a snapshot's source.lag): "waiting: 12 files,
  // 3.10 MB, oldest 2.4 s"; "waiting: –" before the run's driver has measured it.
  function lagText(source) {
    const lag = source && source.lag;
    if (!lag) return "waiting: –";
    const noun = source.kind === "stream" ? (lag.entries === 1 ? "entry" : "entries")
      : (lag.entries === 1 ? "file" : "files");
    const oldest = lag.entries ? `, oldest ${Number(lag.age_s).toFixed(1)} s` : "";
    return `waiting: ${lag.entries} ${noun}, ${bytes(lag.bytes)}${oldest}`;
  }

  function niceCeil(v) {
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  // A time chart: each series {points: [[t, v], ...], cls, dashed} on one axis that runs
  // to the latest point of any (at least opts.minT, 10 s by default); marks are vertical
  // lines {t, label, cls} (a bound). opts.width and opts.height size its drawing.
  function lineChart(root, series, opts) {
    const W = opts.width || 560, H = opts.height || 190, padL = 70, padR = 12, padT = 10, padB = 28;
    while (root.firstChild) root.removeChild(root.firstChild);
    root.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const x0 = padL, x1 = W - padR, y0 = H - padB, y1 = padT;
    const ends = series.map((s) => (s.points.length ? s.points[s.points.length - 1][0] : 0));
    const marks = opts.marks || [];
    const tMax = Math.max(opts.minT === undefined ? 10 : opts.minT, ...ends, ...marks.map((m) => m.t * 1.05));
    const X = (t) => x0 + t / tMax * (x1 - x0);
    const Y = (v) => y0 - Math.min(1, v / opts.yMax) * (y0 - y1);
    for (let i = 0; i <= 4; i++) {
      const v = opts.yMax * i / 4;
      root.appendChild(svg("line", { x1: x0, x2: x1, y1: Y(v), y2: Y(v), class: "grid" }));
      root.appendChild(svg("text", { x: x0 - 6, y: Y(v) + 4, class: "axis", "text-anchor": "end" }, opts.yFormat(v)));
    }
    const stepT = niceCeil(tMax / 6);
    for (let t = 0; t <= tMax + 1e-9; t += stepT) {
      root.appendChild(svg("line", { x1: X(t), x2: X(t), y1: y0, y2: y0 + 4, class: "tick" }));
      const label = tMax < 10 ? t.toFixed(1) + " s" : duration(t);  // seconds: a short simulation
      root.appendChild(svg("text", { x: X(t), y: H - 8, class: "axis", "text-anchor": "middle" }, label));
    }
    root.appendChild(svg("line", { x1: x0, x2: x1, y1: y0, y2: y0, class: "axis-line" }));
    for (const m of marks) {
      root.appendChild(svg("line", { x1: X(m.t), x2: X(m.t), y1: y0, y2: y1, class: "mark " + (m.cls || "") }));
      root.appendChild(svg("text", { x: X(m.t) + 3, y: y1 + 10, class: "axis mark-label" }, m.label));
    }
    if (!series.some((s) => s.points.length)) {
      root.appendChild(svg("text", { x: (x0 + x1) / 2, y: (y0 + y1) / 2, class: "axis", "text-anchor": "middle" }, "waiting for data"));
      return;
    }
    for (const s of series) {
      if (!s.points.length) continue;
      const d = s.points.map((p, i) => `${i ? "L" : "M"}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" ");
      const path = svg("path", { d, class: "series " + s.cls + (s.dashed ? " dashed" : "") });
      if (s.title) path.appendChild(svg("title", {}, s.title));
      root.appendChild(path);
    }
  }

  function readJson(id) {
    const node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }

  global.BP = Object.assign(global.BP || {}, {
    SVG_NS, LEVEL_WARN, LEVEL_BAD, cookie, api, el, svg, levelClass, levelBandText,
    labelLevelBands, pct, bytes, rate, count, duration, clock, lagText, readJson, niceCeil, lineChart,
  });
})(window);
