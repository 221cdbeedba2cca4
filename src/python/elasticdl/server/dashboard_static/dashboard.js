// ElasticDL dashboard. Plain script, no dependencies: the pages are served with a strict
// Content-Security-Policy (no inline code, this origin only), so every handler is attached here
// and every value from the server is written as text (textContent), never as markup.
"use strict";

(function () {
  const TOKEN_KEY = "elasticdl.token"; // sessionStorage: this tab only, gone when it closes
  const REFRESH_MS = 2000;
  const LOG_LINES = 200;
  const FINAL_PHASES = ["Succeeded", "Failed", "Cancelled"];
  const LIVE_PHASES = ["Pending", "Running"];
  const COLORS = ["#2358c4", "#d9480f", "#16794c", "#7048e8", "#c2255c", "#0b7285"];
  const SVG_NS = "http://www.w3.org/2000/svg";

  const $ = (id) => document.getElementById(id);

  class AuthError extends Error {}

  class HttpError extends Error {
    constructor(message, status) {
      super(message);
      this.status = status;
    }
  }

  // ---- DOM helpers ---------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    for (const c of children) node.append(c instanceof Node ? c : String(c));
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function show(node, visible) {
    node.hidden = !visible;
  }

  // ---- API -----------------------------------------------------------------------------
  async function detail(resp) {
    try {
      const body = await resp.json();
      if (body && body.detail) return String(body.detail);
    } catch (e) {
      /* not JSON: fall through */
    }
    return `${resp.status} ${resp.statusText}`;
  }

  async function api(method, path) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (!token) throw new AuthError("");
    const resp = await fetch(path, {
      method,
      headers: { Authorization: "Bearer " + token },
      cache: "no-store",
      credentials: "omit",
    });
    if (resp.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      throw new AuthError(await detail(resp));
    }
    if (!resp.ok) throw new HttpError(await detail(resp), resp.status);
    return resp;
  }

  const getJSON = async (path) => (await api("GET", path)).json();
  const jobPath = (name) => "/v1/jobs/" + encodeURIComponent(name);

  // ---- formatting ----------------------------------------------------------------------
  function age(job) {
    if (typeof job.created_at !== "number") return "-";
    let s = Math.max(0, Math.floor(Date.now() / 1000 - job.created_at));
    const units = [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]];
    const parts = [];
    for (const [unit, size] of units) {
      if (s >= size || (unit === "s" && parts.length === 0)) {
        parts.push(Math.floor(s / size) + unit);
        s %= size;
      }
      if (parts.length === 2) break;
    }
    return parts.join(" ");
  }

  // The same rule as JobStatus.progress (records, else tasks).
  function progress(job) {
    if (job.records_expected > 0) {
      let expected = job.records_expected;
      if (job.num_epochs > job.epoch && job.epoch > 0) {
        expected = Math.floor((expected * job.num_epochs) / job.epoch);
      }
      return Math.min(100, Math.floor((100 * job.records_trained) / expected)) + "%";
    }
    const total = (job.tasks_todo || 0) + (job.tasks_doing || 0) + (job.tasks_done || 0);
    if (total > 0) return Math.floor((100 * (job.tasks_done || 0)) / total) + "%";
    return job.phase === "Succeeded" ? "100%" : "-";
  }

  function replicasText(job) {
    const replicas = job.replicas || [];
    if (!replicas.length) return "-";
    const running = replicas.filter((r) => r.phase === "Running").length;
    const pending = replicas.filter((r) => r.phase === "Pending").length;
    const restarts = replicas.reduce((n, r) => n + (r.restarts || 0), 0);
    let text = `${running}/${replicas.length} running`;
    if (pending) text += `, ${pending} pending`;
    if (restarts) text += `, ${restarts} restart${restarts === 1 ? "" : "s"}`;
    return text;
  }

  // The same rule as JobStatus.workers_summary: running / all the job has now.
  function workersText(job) {
    const workers = (job.replicas || []).filter((r) => r.type === "worker");
    const running = workers.filter((r) => r.phase === "Running").length;
    const pending = workers.filter((r) => r.phase === "Pending").length;
    if (running + pending === 0) return "-";
    return `${running}/${running + pending}` + (pending ? ` (${pending} pending)` : "");
  }

  // The same rule as JobStatus.eta (the master's recent speed, not the job's average).
  function seconds(v) {
    const s = Math.round(Math.max(0, v));
    if (s < 60) return `${s}s`;
    const pad = (n) => String(n).padStart(2, "0");
    if (s < 3600) return `${Math.floor(s / 60)}m${pad(s % 60)}s`;
    return `${Math.floor(s / 3600)}h${pad(Math.floor((s % 3600) / 60))}m`;
  }

  function speedText(job) {
    if (typeof job.records_per_second !== "number") return "-";
    const eta = typeof job.eta_seconds === "number" ? `ETA ${seconds(job.eta_seconds)}`
      : "ETA unknown (no progress lately)";
    return `${Number(job.records_per_second.toPrecision(4))} records/s now, ${eta}`;
  }

  // Why a replica waits (the scheduler's words) or who ended it from outside.
  function replicaReason(r) {
    if (r.phase === "Pending" && (r.waiting_reason || r.waiting_message)) {
      return [r.waiting_reason, r.waiting_message].filter(Boolean).join(": ");
    }
    if (r.ended_by) return r.message ? `${r.ended_by}: ${r.message}` : r.ended_by;
    return r.message || "";
  }

  function number(v) {
    if (typeof v !== "number") return String(v);
    if (Number.isInteger(v)) return String(v);
    return Math.abs(v) >= 1000 || Math.abs(v) < 0.001 ? v.toExponential(3) : v.toFixed(4);
  }

  const phaseCell = (phase) => el("td", { class: "phase phase-" + phase }, phase || "-");

  // ---- charts --------------------------------------------------------------------------
  function niceTicks(lo, hi, count) {
    const span = hi - lo;
    const raw = span / Math.max(1, count);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => span / s <= count) || 10 * mag;
    const ticks = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
      ticks.push(Number(t.toPrecision(12)));
    }
    return ticks;
  }

  const tickLabel = (t) => String(Number(t.toPrecision(6)));

  // series: [{name, points: [[x, y], ...]}]; one SVG line (and a dot per point) each.
  function lineChart(container, series, xLabel) {
    const W = 560, H = 270, L = 58, R = 16, T = 28, B = 40; // the legend sits above the plot
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
    const all = series.flatMap((s) => s.points);
    if (!all.length) {
      root.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "no-data" },
        "No data yet"));
      container.replaceChildren(root);
      return;
    }
    let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
    let y0 = Math.min(...all.map((p) => p[1])), y1 = Math.max(...all.map((p) => p[1]));
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    const yTicks = niceTicks(y0, y1, 5);
    y0 = Math.min(y0, yTicks[0]);
    y1 = Math.max(y1, yTicks[yTicks.length - 1]);
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
    for (const t of yTicks) {
      root.append(svg("line", { x1: L, x2: W - R, y1: sy(t), y2: sy(t), class: "grid" }));
      root.append(svg("text", { x: L - 6, y: sy(t) + 4, "text-anchor": "end" }, tickLabel(t)));
    }
    for (const t of niceTicks(x0, x1, 6).filter((t) => Number.isInteger(t))) {
      root.append(svg("line", { x1: sx(t), x2: sx(t), y1: H - B, y2: H - B + 4, class: "axis" }));
      root.append(svg("text", { x: sx(t), y: H - B + 16, "text-anchor": "middle" }, t));
    }
    root.append(svg("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
    root.append(svg("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }));
    root.append(svg("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle" }, xLabel));
    series.forEach((s, i) => {
      const color = COLORS[i % COLORS.length];
      const g = svg("g", { class: "series", "data-series": s.name });
      const d = s.points.map((p, j) => `${j ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`);
      g.append(svg("path", { d: d.join(""), fill: "none", stroke: color, "stroke-width": 2 }));
      for (const [x, y] of s.points) {
        const dot = svg("circle", { cx: sx(x), cy: sy(y), r: 2.5, fill: color, class: "point" });
        dot.append(svg("title", {}, `${s.name} = ${number(y)} at model version ${x}`));
        g.append(dot);
      }
      const legendX = L + 110 * i;
      g.append(svg("rect", { x: legendX, y: 8, width: 10, height: 10, fill: color }));
      g.append(svg("text", { x: legendX + 14, y: 17, fill: color, class: "legend" }, s.name));
      root.append(g);
    });
    container.replaceChildren(root);
  }

  // ---- the page's skeleton: sign-in, errors, periodic refresh --------------------------
  let timer = null;
  let stopped = false;

  function showError(message) {
    $("error").textContent = message || "";
    show($("error"), Boolean(message));
  }

  function showLogin(message) {
    clearTimeout(timer);
    show($("content"), false);
    show($("sign-out"), false);
    show($("login"), true);
    showError(message);
    $("token").focus();
  }

  function start(page) {
    stopped = false;
    show($("login"), false);
    show($("sign-out"), true);
    const tick = async () => {
      try {
        const more = await page.refresh();
        showError("");
        show($("content"), true);
        $("updated").textContent = "Updated " + new Date().toLocaleTimeString();
        if (more === false) stopped = true;
      } catch (e) {
        if (e instanceof AuthError) {
          showLogin(e.message);
          return;
        }
        showError(e.message);
      }
      if (!stopped) timer = setTimeout(tick, REFRESH_MS);
    };
    page.kick = () => {
      clearTimeout(timer);
      stopped = false;
      tick();
    };
    tick();
  }

  function init(page) {
    $("login").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = $("token").value.trim();
      if (!token) return;
      sessionStorage.setItem(TOKEN_KEY, token);
      $("token").value = "";
      start(page);
    });
    $("sign-out").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin("");
    });
    if (page.init) page.init();
    if (sessionStorage.getItem(TOKEN_KEY)) start(page);
    else showLogin("");
  }

  // ---- the jobs table ------------------------------------------------------------------
  const jobsPage = {
    async refresh() {
      const data = await getJSON("/v1/jobs");
      const jobs = (Array.isArray(data) ? data : data.jobs || []).slice();
      jobs.sort((a, b) => (b.created_at || 0) - (a.created_at || 0));
      $("jobs").tBodies[0].replaceChildren(...jobs.map((job) => el("tr", { "data-job": job.job_name },
        el("td", {}, el("a", { href: "job.html?job=" + encodeURIComponent(job.job_name) }, job.job_name)),
        phaseCell(job.phase),
        el("td", {}, progress(job)),
        el("td", {}, replicasText(job)),
        el("td", {}, age(job)))));
      show($("empty"), jobs.length === 0);
    },
  };

  // ---- one job -------------------------------------------------------------------------
  const jobPage = {
    name: new URLSearchParams(location.search).get("job") || "",
    final: false,
    // What DELETE answered. On Kubernetes a cancelled job's pods are removed, so the job is
    // "not found" from then on: the page keeps showing this status instead of an error.
    cancelled: null,
    logPinned: true,

    init() {
      $("job-name").textContent = this.name;
      document.title = this.name + " - ElasticDL";
      $("cancel").addEventListener("click", () => {
        show($("cancel"), false);
        show($("cancel-confirm"), true);
      });
      $("cancel-no").addEventListener("click", () => {
        show($("cancel-confirm"), false);
        show($("cancel"), !this.final);
      });
      $("cancel-yes").addEventListener("click", () => this.cancel());
      $("log-replica").addEventListener("change", () => {
        this.logPinned = true; // another replica's log: show its end
        this.refreshLog();
      });
      // The log shows its newest lines until the reader scrolls up; back at the end, it
      // follows again.
      $("log").addEventListener("scroll", () => {
        const pre = $("log");
        this.logPinned = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      });
    },

    async cancel() {
      $("cancel-yes").disabled = $("cancel-no").disabled = true;
      try {
        this.cancelled = await (await api("DELETE", jobPath(this.name))).json();
        show($("cancel-confirm"), false);
      } catch (e) {
        if (e instanceof AuthError) return showLogin(e.message);
        showError("Cannot cancel: " + e.message);
      } finally {
        $("cancel-yes").disabled = $("cancel-no").disabled = false;
      }
      this.kick();
    },

    async refresh() {
      if (!this.name) throw new Error("No job given: open a job from the jobs table.");
      let status, metrics;
      try {
        [status, metrics] = await Promise.all([
          getJSON(jobPath(this.name)),
          getJSON(jobPath(this.name) + "/metrics"),
        ]);
      } catch (e) {
        if (this.cancelled && e instanceof HttpError && e.status === 404) return this.removed();
        throw e;
      }
      this.final = FINAL_PHASES.includes(status.phase);
      this.renderSummary(status);
      this.renderCharts(status, metrics);
      this.renderReplicas(status);
      await this.refreshLog();
      // A finished job changes no more once its replicas ended too (on Kubernetes the master
      // pod outlives the phase it sets by a moment): then stop polling.
      const ended = (status.replicas || []).every((r) => !LIVE_PHASES.includes(r.phase));
      return !(this.final && ended);
    },

    // The job was cancelled and is gone (its pods removed): its last status, curves and log
    // tail stay on the page; its replicas are gone with it.
    removed() {
      this.final = true;
      const s = this.cancelled;
      this.renderSummary({ ...s, message: (s.message ? s.message + "; " : "") +
        "the job and its replicas were removed" });
      $("replicas").tBodies[0].replaceChildren();
      return false;
    },

    renderSummary(s) {
      const epochs = s.num_epochs ? `${s.epoch}/${s.num_epochs}` : String(s.epoch || "-");
      const records = s.records_expected ? `${s.records_trained}/${s.records_expected}`
        : String(s.records_trained || 0);
      const items = [
        ["Phase", s.phase], ["Progress", progress(s)], ["Model version", s.model_version],
        ["Epoch", epochs], ["Records trained", records], ["Tasks done", s.tasks_done],
        ["Type", s.job_type || "-"], ["Age", age(s)],
        ["Workers", workersText(s)], ["Speed", this.final ? "-" : speedText(s)],
      ];
      $("summary").replaceChildren(...items.flatMap(([k, v]) => [
        el("dt", {}, k),
        el("dd", k === "Phase" ? { class: "phase phase-" + v, id: "phase" } : {}, v),
      ]));
      $("message").textContent = s.message || "";
      show($("message"), Boolean(s.message));
      const confirming = !$("cancel-confirm").hidden;
      show($("cancel"), !this.final && !confirming);
      if (this.final) show($("cancel-confirm"), false);
    },

    renderCharts(status, metrics) {
      const loss = (metrics.loss || []).map((p) => [p.model_version, p.loss]);
      lineChart($("loss-chart"), [{ name: "loss", points: loss }], "model version");
      const names = [];
      for (const round of metrics.evaluation || []) {
        for (const [k, v] of Object.entries(round.metrics || {})) {
          if (typeof v === "number" && !names.includes(k)) names.push(k);
        }
      }
      const series = names.map((name) => ({
        name,
        points: (metrics.evaluation || [])
          .filter((r) => typeof (r.metrics || {})[name] === "number")
          .map((r) => [r.model_version, r.metrics[name]]),
      }));
      lineChart($("eval-chart"), series, "model version");
      const latest = Object.entries(status.evaluation_metrics || {});
      $("eval-latest").tBodies[0].replaceChildren(...latest.map(([k, v]) =>
        el("tr", { "data-metric": k }, el("th", {}, k), el("td", {}, number(v)))));
    },

    renderReplicas(s) {
      const replicas = s.replicas || [];
      $("replicas").tBodies[0].replaceChildren(...replicas.map((r) => el("tr", { "data-replica": r.name },
        el("td", {}, r.name),
        phaseCell(r.phase),
        el("td", {}, r.restarts || 0),
        el("td", {}, r.exit_code === null || r.exit_code === undefined ? "" : r.exit_code),
        el("td", { class: "reason" }, replicaReason(r)),
        el("td", {}, r.replaced_by === null || r.replaced_by === undefined ? ""
          : `${r.type}-${r.replaced_by}`))));
      const select = $("log-replica");
      const wanted = ["master", ...replicas.map((r) => r.name).filter((n) => n !== "master")];
      const have = Array.from(select.options).map((o) => o.value);
      if (wanted.join() !== have.join()) {
        const chosen = select.value || "master";
        select.replaceChildren(...wanted.map((n) => el("option", { value: n }, n)));
        select.value = wanted.includes(chosen) ? chosen : "master";
      }
    },

    async refreshLog() {
      const replica = $("log-replica").value || "master";
      const pre = $("log");
      let text;
      try {
        const query = `replica=${encodeURIComponent(replica)}&tail=${LOG_LINES}`;
        const resp = await api("GET", `${jobPath(this.name)}/logs?${query}`);
        text = await resp.text();
      } catch (e) {
        if (e instanceof AuthError) throw e;
        text = `(no log: ${e.message})`;
      }
      pre.textContent = text;
      const pin = () => {
        if (this.logPinned) pre.scrollTop = pre.scrollHeight;
      };
      pin();
      setTimeout(pin, 0); // the first time, once the page is shown (hidden, nothing scrolls)
    },
  };

  document.addEventListener("DOMContentLoaded", () => {
    init(document.body.dataset.page === "job" ? jobPage : jobsPage);
  });
})();
