// A pushed row for a session this page does not show yet (one the gateway just created):
// htmx has no target to swap it into, so put it at the top of the table (or reload the table
// when the list was empty).
document.addEventListener('htmx:oobErrorNoTarget', (event) => {
  const row = event.detail.content;
  if (!row || !row.id || !row.id.startsWith('row-')) return;
  const body = document.querySelector('#sessions-table table.sessions tbody');
  if (body) { row.removeAttribute('hx-swap-oob'); body.prepend(row); htmx.process(row); }
  else { htmx.ajax('GET', window.location.href, {target: '#sessions-table', swap: 'outerHTML', select: '#sessions-table'}); }
});
