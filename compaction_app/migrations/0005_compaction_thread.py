from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("compaction_app", "0004_gateway_trigger"),
    ]

    operations = [
        migrations.AddField(
            model_name="compactionrun",
            name="thread",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
    ]
