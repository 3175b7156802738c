// pgdurable dashboard: live refresh over SSE (one stream per tab, fed by ONE
// LISTEN connection in the server) and keyboard navigation. No framework.
(function () {
  "use strict";
  var body = document.body, root = body.dataset.root || "", live = body.dataset.live || "";
  var status = document.getElementById("live");
  var pending = null;

  function refresh() {
    pending = null;
    fetch(location.href, {headers: {"Accept": "text/html"}}).then(function (r) {
      return r.text();
    }).then(function (html) {
      var doc = new DOMParser().parseFromString(html, "text/html");
      var fresh = doc.getElementById("content"), main = document.getElementById("content");
      var active = document.activeElement;
      if (!fresh || !main) return;
      if (active && main.contains(active) && /INPUT|SELECT|TEXTAREA/.test(active.tagName)) return;
      main.innerHTML = fresh.innerHTML;
      body.dataset.refreshed = String(Date.now());
    });
  }
  function schedule(delay) { if (!pending) pending = setTimeout(refresh, delay); }

  if (live && window.EventSource) {
    var es = new EventSource(root + "/events");
    es.onopen = function () { status.textContent = "live"; };
    es.onerror = function () { status.textContent = "reconnecting…"; };
    es.onmessage = function (e) {
      var m = JSON.parse(e.data);
      if (live === "all") { schedule(250); return; }
      if (m.channel === "reconnect" || (m.runs && m.runs.indexOf(live) >= 0) ||
          (m.channel === "steps" && m.runs && m.runs.length === 0)) schedule(50);
    };
  }

  // keyboard: q/r/s/l pages, / search, j/k rows, Enter opens the row's link
  var sel = -1;
  function rows() { return Array.prototype.slice.call(document.querySelectorAll("table.nav-rows tbody tr")); }
  function mark(i) {
    var rs = rows(); if (!rs.length) return;
    sel = Math.max(0, Math.min(rs.length - 1, i));
    rs.forEach(function (r, j) { r.classList.toggle("sel", j === sel); });
    var a = rs[sel].querySelector("a"); if (a) a.focus(); else { rs[sel].tabIndex = -1; rs[sel].focus(); }
  }
  document.addEventListener("keydown", function (e) {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    if (/INPUT|SELECT|TEXTAREA/.test(e.target.tagName)) { if (e.key === "Escape") e.target.blur(); return; }
    var go = {q: "/", r: "/runs", s: "/schedules", e: "/event-log", w: "/workers", l: "/leases", b: "/budgets"}[e.key];
    if (go) { location.href = root + go; return; }
    if (e.key === "/") { var s = document.getElementById("search"); if (s) { e.preventDefault(); s.focus(); } }
    if (e.key === "j") mark(sel + 1);
    if (e.key === "k") mark(sel - 1);
  });
})();
