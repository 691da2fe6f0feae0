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

  function readJson(id) {
    const node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }

  global.BP = Object.assign(global.BP || {}, {
    SVG_NS, LEVEL_WARN, LEVEL_BAD, cookie, api, el, svg, levelClass, levelBandText,
    labelLevelBands, pct, bytes, rate, duration, clock, lagText, readJson,
  });
})(window);
