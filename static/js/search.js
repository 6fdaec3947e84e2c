// Session search: a hit opens the folds around its event (templates/dashboard/_search.html).
// The page's own reveal (static/js/dashboard.js: opens the folds around an event) when it
// is there; a minimal one otherwise, so this partial works on any page that includes it.
(function () {
  function reveal(seq) {
    var id = "event-" + seq, el = document.getElementById(id);
    if (!el) return false;
    if (window.ledgerReveal) { window.ledgerReveal(id); return true; }
    for (var d = el.closest("details"); d; d = d.parentElement && d.parentElement.closest("details")) d.open = true;
    el.scrollIntoView({block: "center"});
    return true;
  }
  document.addEventListener("click", function (e) {
    var link = e.target.closest && e.target.closest("a.search-hit[data-seq]");
    if (link && reveal(link.dataset.seq)) {
      e.preventDefault();
      history.replaceState(null, "", "#event-" + link.dataset.seq);
    }
  });
  var m = location.hash.match(/^#event-(\d+)$/);
  document.addEventListener("DOMContentLoaded", function () {
    if (m && !window.ledgerReveal) reveal(m[1]);
  });
})();
