/* orchard-rec viewer: plain JavaScript, no build step.
 * Sessions page: live refresh of the rows (polling /api/stats), selects submit at once.
 * Session page: progressive token rendering (every token element ends up in the DOM), hover
 * details, heat map, call details (chat / raw JSON) fetched from /api or taken from the
 * embedded data in a standalone file, live updates in place as calls and the outcome arrive. */
(function () {
  "use strict";
  var body = document.body;
  var base = body.dataset.base || "";
  var standalone = body.dataset.standalone === "1";
  var pollMs = +body.dataset.poll || 2000;

  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) {
      return c === "&" ? "&amp;" : c === "<" ? "&lt;" : c === ">" ? "&gt;" : "&quot;";
    });
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin" }).then(function (r) {
      if (!r.ok) throw new Error(url + ": " + r.status);
      return r.json();
    });
  }

  function poll(url, ms, onChange) {
    var last = null;
    var live = document.getElementById("live");
    function tick() {
      getJSON(url).then(function (s) {
        var key = JSON.stringify(s);
        if (last !== null && key !== last) onChange(s);
        last = key;
        if (live) live.classList.remove("off");
      }).catch(function () {
        if (live) live.classList.add("off");
      }).then(function () { setTimeout(tick, ms); });
    }
    tick();
  }

  /* ---------------------------------------------------------------- sessions page */
  function sessionsPage() {
    var form = document.getElementById("filters");
    form.querySelectorAll("select, input[type=checkbox]").forEach(function (s) {
      s.addEventListener("change", function () { form.submit(); });
    });
    form.addEventListener("submit", function () {
      form.querySelectorAll("input, select").forEach(function (el) {
        if (!el.value) el.disabled = true; /* keep the URL short */
      });
    });
    /* Curate: pick sessions (kept across live refreshes and pages of this tab), download their export. */
    var picked = {};
    try { picked = JSON.parse(sessionStorage.getItem("orchard-picked") || "{}"); } catch (e) { picked = {}; }
    function showPicks() {
      var n = Object.keys(picked).length;
      document.getElementById("picked").textContent = n;
      document.getElementById("curate").hidden = n === 0;
      document.querySelectorAll("input.pick").forEach(function (c) { c.checked = !!picked[c.value]; });
      sessionStorage.setItem("orchard-picked", JSON.stringify(picked));
    }
    document.getElementById("rows").addEventListener("change", function (ev) {
      var c = ev.target;
      if (!c.classList || !c.classList.contains("pick")) return;
      if (c.checked) picked[c.value] = 1; else delete picked[c.value];
      showPicks();
    });
    document.getElementById("pick-all").addEventListener("change", function (ev) {
      document.querySelectorAll("input.pick").forEach(function (c) {
        if (ev.target.checked) picked[c.value] = 1; else delete picked[c.value];
      });
      showPicks();
    });
    document.querySelectorAll("#curate .dl").forEach(function (a) {
      a.addEventListener("click", function (ev) {
        ev.preventDefault();
        /* a form POST: a long selection would outgrow a URL */
        var f = document.createElement("form");
        f.method = "post"; f.action = base + "/api/export"; f.hidden = true;
        [["format", a.dataset.format]].concat(Object.keys(picked).map(function (id) { return ["session", id]; })).forEach(function (kv) {
          var i = document.createElement("input"); i.name = kv[0]; i.value = kv[1]; f.appendChild(i);
        });
        document.body.appendChild(f); f.submit(); f.remove();
      });
    });
    document.querySelector("#curate .clear-picks").addEventListener("click", function (ev) {
      ev.preventDefault(); picked = {}; showPicks();
    });
    showPicks();

    poll(base + "/api/stats", pollMs, function () {
      var q = location.search ? location.search + "&" : "?";
      Promise.all([
        fetch(location.pathname + q + "fragment=rows", { credentials: "same-origin" }).then(function (r) { return r.text(); }),
        getJSON(base + "/api/sessions" + (location.search || "")),
      ]).then(function (res) {
        document.getElementById("rows").innerHTML = res[0];
        showPicks();
        var total = document.getElementById("total");
        total.dataset.total = res[1].total;
        total.innerHTML = "<b>" + res[1].total.toLocaleString("en-US") + "</b> session" + (res[1].total === 1 ? "" : "s");
        document.querySelectorAll(".pageno").forEach(function (p) {
          p.innerHTML = "page <b>" + res[1].page + "</b> of " + res[1].pages.toLocaleString("en-US");
        });
        var live = document.getElementById("live");
        if (live) { live.classList.add("flash"); setTimeout(function () { live.classList.remove("flash"); }, 800); }
      });
    });
  }

  /* ---------------------------------------------------------------- raw JSON */
  function pretty(v, ind) {
    ind = ind || "";
    if (v === null || typeof v !== "object") return esc(JSON.stringify(v));
    var inner = ind + "  ";
    if (Array.isArray(v)) {
      if (!v.length) return "[]";
      if (v.every(function (x) { return typeof x === "number"; })) {
        return '<span class="nums">[' + v.join(", ") + "]</span>";
      }
      return "[\n" + v.map(function (x) { return inner + pretty(x, inner); }).join(",\n") + "\n" + ind + "]";
    }
    var keys = Object.keys(v);
    if (!keys.length) return "{}";
    return "{\n" + keys.map(function (k) {
      return inner + '<span class="k">' + esc(JSON.stringify(k)) + "</span>: " + pretty(v[k], inner);
    }).join(",\n") + "\n" + ind + "}";
  }

  /* ---------------------------------------------------------------- chat */
  function renderChat(turns) {
    if (!turns || !turns.length) return '<p class="muted">No conversation in this call.</p>';
    return '<div class="chat">' + turns.map(function (t) {
      var blocks = (t.blocks || []).map(function (b) {
        if (b.kind === "reasoning") return '<details class="reasoning" open><summary>reasoning</summary><div class="txt">' + esc(b.text || "") + "</div></details>";
        if (b.kind === "tool_call") return '<div class="toolcall"><div class="tc-head">→ tool call <b>' + esc(b.name || "?") + "</b>" + (b.id ? ' <span class="sub">' + esc(b.id) + "</span>" : "") + '</div><pre>' + esc(b.text || "") + "</pre></div>";
        if (b.kind === "tool_result") return '<div class="toolres"><div class="tc-head">← tool result' + (b.id ? ' <span class="sub">' + esc(b.id) + "</span>" : "") + '</div><pre>' + esc(b.text || "") + "</pre></div>";
        if (b.kind === "image") return b.url ? '<a class="thumb" href="' + esc(b.url) + '" target="_blank" rel="noopener"><img src="' + esc(b.url) + '" alt="image" loading="lazy"></a>' : '<pre>' + esc(b.text || "") + "</pre>";
        return '<div class="txt">' + esc(b.text || "") + "</div>";
      }).join("");
      return '<div class="msg role-' + esc(t.role) + (t.answer ? " answer" : "") + '"><div class="role">' + esc(t.role) + (t.answer ? " · answer" : "") + "</div>" + blocks + "</div>";
    }).join("") + "</div>";
  }

  /* ---------------------------------------------------------------- session page */
  function sessionPage() {
    var el = document.getElementById("page-data");
    var data = JSON.parse(el.textContent);
    var sid = body.dataset.session;
    var vocab = data.vocab || {};
    var details = data.call_details || {};
    var tip = document.getElementById("tip");

    function callDetail(seq) {
      if (details[seq]) return Promise.resolve(details[seq]);
      return getJSON(base + "/api/sessions/" + encodeURIComponent(sid) + "/calls/" + seq).then(function (d) {
        details[seq] = d;
        return d;
      });
    }

    function showTab(call, tab) {
      var seq = call.dataset.callSeq;
      var out = call.querySelector(".tab-body");
      call.querySelectorAll(".tabs button").forEach(function (b) { b.classList.toggle("on", b.dataset.tab === tab); });
      callDetail(seq).then(function (d) {
        if (tab === "chat") out.innerHTML = renderChat(d.chat);
        else if (tab === "meta") {
          var meta = { call_id: d.call_id, method: d.method, path: d.path, status: d.status_code, outcome: d.outcome, headers: d.headers, usage: d.usage, metadata: d.metadata };
          if (d.error != null) meta.error = d.error; /* the proxy's error, or the error body the upstream answered with */
          out.innerHTML = '<pre class="json">' + pretty(meta) + "</pre>" +
            '<div class="sbs-title">response headers</div>' + (d.response_headers == null ? '<p class="muted">not recorded</p>' : '<pre class="json response-headers">' + pretty(d.response_headers) + "</pre>");
        }
        else if (tab === "events") out.innerHTML = renderEvents(d.events);
        else if (tab === "curl") {
          out.innerHTML = '<div class="curl"><button type="button" class="copy">Copy</button> <span class="sub copied" hidden>copied</span>' +
            '<p class="sub">secrets masked; the key comes from your shell\'s environment</p><pre class="curl-text">' + esc(d.curl) + "</pre></div>";
          out.querySelector(".copy").addEventListener("click", function () { copyText(d.curl, out.querySelector(".copied")); });
        }
        else if (tab === "resend") {
          out.innerHTML = '<div class="resend"><button type="button" class="send">Send again</button> <span class="sub">replays the request the upstream got (unstreamed); nothing is recorded</span><div class="resend-out"></div></div>';
          out.querySelector(".send").addEventListener("click", function () { sendAgain(seq, d, out.querySelector(".resend-out")); });
        }
        else out.innerHTML = d[tab] == null ? '<p class="muted">none recorded</p>' : '<pre class="json">' + pretty(d[tab]) + "</pre>";
      }).catch(function (e) { out.textContent = String(e); });
    }

    function renderEvents(ev) {
      if (!ev) return '<p class="muted">not a streamed call</p>';
      var rows = ev.events.map(function (e) {
        var t = ev.timed ? '<td class="num ev-ms">+' + e.ms + '</td><td class="num ev-gap">' + (e.gap_ms == null ? "" : "+" + e.gap_ms) + "</td>" : "";
        return '<tr data-event="' + e.i + '"' + (ev.timed ? ' data-ms="' + e.ms + '"' : "") + '><td class="num">' + e.i + "</td>" + t + "<td>" + esc(e.event == null ? "message" : e.event) + '</td><td><code>' + esc(typeof e.data === "string" ? e.data : JSON.stringify(e.data)) + "</code></td></tr>";
      }).join("");
      var head = ev.timed ? "<th>ms</th><th>gap</th>" : "";
      return '<p class="sub events-timing">' + ev.count + " events · first byte +" + (ev.first_byte_ms == null ? "?" : ev.first_byte_ms) + " ms · done +" + ev.done_ms + " ms" +
        (ev.max_gap_ms == null ? "" : " · longest gap " + ev.max_gap_ms + " ms") + " · " + esc(ev.timing) + "</p>" +
        '<div class="events-wrap"><table class="events"><thead><tr><th>#</th>' + head + "<th>event</th><th>data</th></tr></thead><tbody>" + rows + "</tbody></table></div>";
    }

    function copyText(text, note) {
      function done() { if (note) { note.hidden = false; setTimeout(function () { note.hidden = true; }, 1500); } }
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(done, function () {});
        return;
      }
      var ta = document.createElement("textarea");
      ta.value = text; document.body.appendChild(ta); ta.select();
      try { document.execCommand("copy"); done(); } catch (e) { /* the text is on screen to select */ }
      ta.remove();
    }

    function sendAgain(seq, d, box) {
      box.innerHTML = '<p class="loading">sending…</p>';
      fetch(base + "/api/sessions/" + encodeURIComponent(sid) + "/calls/" + seq + "/resend", {
        method: "POST", credentials: "same-origin", headers: { "X-Orchard-Resend": "1" },
      }).then(function (r) { return r.json(); }).then(function (res) {
        if (res.error && res.status == null) { box.innerHTML = '<p class="call-error">' + esc(res.error) + "</p>"; return; }
        box.innerHTML = '<p class="sub resend-status">' + esc(res.url) + " → <b>" + res.status + "</b> in " + res.latency_ms + ' ms</p><div class="sbs">' +
          '<div class="sbs-col"><div class="sbs-title">recorded answer</div><pre class="json recorded">' + pretty(res.recorded) + "</pre></div>" +
          '<div class="sbs-col"><div class="sbs-title">new answer</div><pre class="json fresh-answer">' + pretty(res.response) + "</pre>" +
          '<div class="sbs-title">its response headers</div><pre class="json resend-headers">' + pretty(res.headers) + "</pre></div></div>";
      }).catch(function (e) { box.textContent = String(e); });
    }

    function bindCall(call) {
      var head = call.querySelector(".call-head");
      var bodyEl = call.querySelector(".call-body");
      head.addEventListener("click", function () {
        var open = bodyEl.hidden;
        bodyEl.hidden = !open;
        head.setAttribute("aria-expanded", String(open));
        call.classList.toggle("open", open);
        if (open && !call.dataset.loaded) { call.dataset.loaded = "1"; showTab(call, "chat"); }
      });
      call.querySelectorAll(".tabs button").forEach(function (b) {
        b.addEventListener("click", function () { showTab(call, b.dataset.tab); });
      });
    }
    document.querySelectorAll(".call").forEach(bindCall);

    function bindHeat() {
      var heat = document.getElementById("heat");
      if (!heat) return;
      heat.checked = body.classList.contains("heat");
      heat.addEventListener("change", function () { body.classList.toggle("heat", heat.checked); });
    }
    bindHeat();

    function bucket(lp) {
      return lp > -0.1 ? 0 : lp > -0.5 ? 1 : lp > -1 ? 2 : lp > -2.5 ? 3 : 4;
    }
    var SPECIAL = /^<[|\/]?[^<>\s]{1,24}[|]?>$/;
    /* Policy versions (asynchronous RL): a band over the generated tokens, one colour per
       version in order of appearance (6 colours, then again), "u" for unknown. */
    function versionBand(s, v) {
      if (v === "unknown") return "u";
      if (!s.vOrder) s.vOrder = {};
      if (!(v in s.vOrder)) s.vOrder[v] = Object.keys(s.vOrder).length % 6;
      return s.vOrder[v];
    }
    function tokenHTML(s, k) {
      var id = s.ids[k];
      var text = vocab[id];
      var kind = s.kind[k];
      var cls = "t k" + kind + " m" + s.mask[k];
      if (kind === 2 && s.lp[k] != null) cls += " h" + bucket(s.lp[k]);
      if (s.v && s.v[k] != null) cls += " pv" + versionBand(s, s.v[k]);
      var shown;
      if (text === undefined) { cls += " raw"; shown = "\u27e8" + id + "\u27e9"; }
      else {
        shown = text;
        if (SPECIAL.test(text)) cls += " sp";
        if (text.indexOf("\n") >= 0) cls += " nl";
        if (text === "") { cls += " raw"; shown = "\u2205"; }
      }
      return '<span class="' + cls + '" data-token-id="' + id + '" data-mask="' + s.mask[k] + '" data-p="' + k + '">' + esc(shown) + "</span>";
    }

    function mark(name) { if (window.performance && performance.mark) performance.mark(name); }
    function sampleOf(box) { return data.samples[+box.dataset.tokensFor]; }
    function hover(box) {
      box.addEventListener("mouseover", function (ev) {
        var t = ev.target.closest("[data-token-id]");
        if (!t) return;
        var s = sampleOf(box);
        var k = +t.dataset.p;
        var kinds = ["prompt", "observation", "generated"];
        var lp = s.lp[k];
        var w = s.w ? s.w[k] : null;
        tip.innerHTML = "<b>#" + k + "</b> id <b>" + s.ids[k] + "</b><br>" + kinds[s.kind[k]] + (s.mask[k] ? " · <span class=good>trained</span>" : " · not trained") +
          (lp != null ? "<br>logprob " + lp.toFixed(4) + " (p " + Math.exp(lp).toFixed(3) + ")" : "") +
          (w != null ? "<br>credit weight " + (+w).toFixed(3) : "") +
          (s.v && s.v[k] != null ? "<br>policy version <b>" + esc(s.v[k]) + "</b>" : "") +
          (vocab[s.ids[k]] !== undefined ? "<br><code>" + esc(JSON.stringify(vocab[s.ids[k]])) + "</code>" : "");
        var r = t.getBoundingClientRect();
        tip.hidden = false;
        tip.style.left = Math.min(window.innerWidth - 260, Math.max(4, r.left)) + "px";
        tip.style.top = (r.bottom + 6) + "px";
      });
      box.addEventListener("mouseleave", function () { tip.hidden = true; });
    }

    /* Progressive rendering: chunks within a frame budget, sample after sample, until every
       token element exists. body[data-tokens-ready] says when. A live update starts it over
       (a newer run stops an older one). */
    var run = 0;
    function renderSamples() {
      var mine = ++run;
      body.dataset.tokensReady = "0";
      var boxes = Array.prototype.slice.call(document.querySelectorAll(".tokens[data-tokens-for]"));
      var jobs = boxes.map(function (box) { return { box: box, s: data.samples[+box.dataset.tokensFor], k: 0 }; });
      jobs.forEach(function (j) { j.box.innerHTML = ""; hover(j.box); });
      var ji = 0;
      var firstChunk = false;
      function step() {
        if (mine !== run) return;
        var t0 = performance.now();
        while (ji < jobs.length && performance.now() - t0 < 14) {
          var j = jobs[ji];
          var n = j.s.ids.length;
          /* one block per chunk (so the browser lays out only the new block, and skips off-screen
             ones: content-visibility), cut after a newline token where one is near */
          var end = Math.min(n, j.k + 3000);
          for (var e = Math.min(n, j.k + 2000); e < Math.min(n, j.k + 4000); e++) {
            var tx = vocab[j.s.ids[e - 1]];
            if (tx !== undefined && tx.indexOf("\n") >= 0) { end = e; break; }
          }
          var html = [];
          for (var k = j.k; k < end; k++) html.push(tokenHTML(j.s, k));
          j.box.insertAdjacentHTML("beforeend", '<div class="chunk">' + html.join("") + "</div>");
          j.k = end;
          if (end >= n) { j.box.dataset.rendered = "1"; ji++; }
        }
        if (!firstChunk) { firstChunk = true; mark("orchard-first-tokens"); }
        if (ji < jobs.length) requestAnimationFrame(step);
        else { body.dataset.tokensReady = "1"; mark("orchard-tokens-ready"); }
      }
      if (jobs.length) step(); else body.dataset.tokensReady = "1";
    }
    renderSamples();

    /* Live: poll the session's small stats endpoint; on a change, fetch the page again and
       swap in what changed (new calls appended, hero, outcome and samples replaced) without a
       reload: open calls and their tabs stay as they are. */
    function swap(sel, doc) {
      var old = document.querySelector(sel);
      var neu = doc.querySelector(sel);
      if (old && neu) old.replaceWith(neu);
      else if (neu) document.querySelector(".hero").insertAdjacentElement("afterend", neu);
      else if (old) old.remove();
    }
    function update() {
      return fetch(location.pathname + location.search, { credentials: "same-origin" }).then(function (r) {
        if (!r.ok) throw new Error(location.pathname + ": " + r.status);
        return r.text();
      }).then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        swap(".hero", doc);
        swap(".outcome-card", doc);
        var list = document.querySelector(".timeline .calls");
        doc.querySelectorAll(".timeline .call").forEach(function (c) {
          var have = list.querySelector('[data-call-seq="' + c.dataset.callSeq + '"]');
          if (have) {  /* waterfall bars move as the span grows */
            var bars = c.querySelector(".track");
            have.querySelector(".track").replaceWith(bars);
          } else {
            list.appendChild(c);
            bindCall(c);
            c.classList.add("fresh");
          }
        });
        swap(".samples-card", doc);
        data = JSON.parse(doc.getElementById("page-data").textContent);
        vocab = data.vocab || {};
        document.getElementById("page-data").textContent = doc.getElementById("page-data").textContent;
        var nb = doc.body.dataset;
        body.dataset.calls = nb.calls;
        body.dataset.outcome = nb.outcome;
        body.dataset.updates = String((+body.dataset.updates || 0) + 1);
        bindHeat();
        renderSamples();
        var live = document.getElementById("live");
        if (live) { live.classList.add("flash"); setTimeout(function () { live.classList.remove("flash"); }, 800); }
      });
    }

    /* Annotations: only the fields changed are sent; an emptied one is cleared. */
    var form = document.getElementById("annotate");
    if (form) {
      form.addEventListener("submit", function (ev) {
        ev.preventDefault();
        var msg = document.getElementById("annotate-msg");
        var changed = {};
        ["reward", "status", "label", "note"].forEach(function (k) {
          var v = form.elements[k].value.trim();
          if (v === (form.dataset[k] || "")) return;
          if (k === "reward") changed[k] = v === "" ? null : +v;
          else changed[k] = v === "" ? null : v;
        });
        if (!Object.keys(changed).length) { msg.textContent = "nothing changed"; return; }
        fetch(base + "/api/sessions/" + encodeURIComponent(sid) + "/outcome", {
          method: "POST", credentials: "same-origin", headers: { "Content-Type": "application/json" }, body: JSON.stringify(changed),
        }).then(function (r) {
          return r.json().then(function (j) { if (!r.ok) throw new Error(j.error || r.status); return j; });
        }).then(function (o) {
          Object.keys(changed).forEach(function (k) { form.dataset[k] = form.elements[k].value.trim(); });
          msg.textContent = "saved";
          form.dataset.saved = String((+form.dataset.saved || 0) + 1);
          return update();
        }).catch(function (e) { msg.textContent = String(e.message || e); msg.classList.add("bad"); });
      });
    }

    if (!standalone) {
      poll(base + "/api/sessions/" + encodeURIComponent(sid) + "/stats", pollMs, function (s) {
        if (s.calls !== +body.dataset.calls || s.outcome !== (body.dataset.outcome === "1")) {
          update().catch(function () { document.getElementById("stale").hidden = false; });
        }
      });
    }
  }

  /* ---------------------------------------------------------------- dashboard (uPlot, vendored) */
  function dashPage() {
    var d = JSON.parse(document.getElementById("dash-data").textContent);
    var form = document.getElementById("dash-filters");
    form.querySelectorAll("select").forEach(function (s) { s.addEventListener("change", function () { form.submit(); }); });
    var COLORS = ["#2f6f4e", "#3566c5", "#d9822b", "#7a3e9d", "#c23b3b", "#5b7fa8", "#b7791f"];
    function chart(id, series, data, opts) {
      var el = document.getElementById(id);
      var o = {
        width: Math.max(320, el.clientWidth || 600), height: 220,
        series: [{}].concat(series.map(function (sr, k) {
          return Object.assign({ stroke: COLORS[k % COLORS.length], width: 1.5, spanGaps: false }, sr);
        })),
        axes: [{}, { size: 60 }],
        legend: { live: true },
        tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); },  /* the page says UTC */
      };
      if (opts) Object.assign(o, opts);
      var u = new uPlot(o, data, el);
      el.dataset.series = String(series.length);
      el.dataset.points = String(data[0].length);
      return u;
    }
    var t = d.t;
    var hs = Object.keys(d.by_harness);
    chart("chart-calls", [{ label: "all", stroke: "#17202b", width: 2 }].concat(hs.map(function (h) { return { label: h }; })),
      [t, d.calls_per_min].concat(hs.map(function (h) { return d.by_harness[h]; })));
    chart("chart-tokens", [{ label: "prompt" }, { label: "completion" }], [t, d.prompt_tokens_per_min, d.completion_tokens_per_min]);
    chart("chart-latency", [{ label: "p50", spanGaps: true }, { label: "p90", spanGaps: true }, { label: "p99", spanGaps: true }], [t, d.p50_ms, d.p90_ms, d.p99_ms]);
    chart("chart-errors", [{ label: "error %", stroke: "#c23b3b" }], [t, d.error_rate.map(function (x) { return x == null ? null : 100 * x; })]);
    var r = d.rewards;
    var mids = r.counts.map(function (_, k) { return (r.edges[k] + r.edges[k + 1]) / 2; });
    chart("chart-rewards", [{ label: "sessions", fill: "rgba(47, 111, 78, .35)", paths: uPlot.paths.bars({ size: [0.9] }) }], [mids, r.counts],
      { scales: { x: { time: false } } });
    body.dataset.chartsReady = "1";
  }

  var page = body.dataset.page;
  if (page === "sessions") sessionsPage();
  else if (page === "session") sessionPage();
  else if (page === "dash") dashPage();
})();
