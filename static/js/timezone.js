// The viewer's time zone, for the dashboard's times: kept in a cookie the server reads
// (compaction_app/dashboard/timezone.py). The first page after a change reloads once.
(function () {
  var zone;
  try { zone = Intl.DateTimeFormat().resolvedOptions().timeZone; } catch (e) { return; }
  if (!zone) return;
  var current = (document.cookie.match(/(?:^|; )ledger_tz=([^;]*)/) || [])[1];
  if (current && decodeURIComponent(current) === zone) return;
  document.cookie = "ledger_tz=" + encodeURIComponent(zone) + "; path=/; max-age=31536000; samesite=lax";
  if (!sessionStorage.getItem("ledger_tz_reloaded")) {
    sessionStorage.setItem("ledger_tz_reloaded", "1");
    location.reload();
  }
})();
